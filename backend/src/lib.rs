//! The Animal Store pets service: an HTTP/JSON catalogue of a store's animals on warp, stored in
//! sled.
//!
//! It serves the public paths (`/v1/pets`, `/v1/pets/{petId}`) so that `Location` and `Link`
//! headers are right without rewriting, and listens on loopback by default: clients reach it
//! through the gateway. [`run`] is the whole service; the root binary only wires it up.

pub mod errors;
pub mod handlers;
pub mod models;
pub mod routes;
pub mod store;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

pub use errors::StoreError;
pub use store::{CommitMode, Store};

/// Default address of the backend: loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8081";
/// Default request body limit: 16 KiB is far above any valid pet.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 16 * 1024;
/// Default time that shutdown waits for requests in flight.
pub const DEFAULT_SHUTDOWN_GRACE_SECONDS: u64 = 10;

/// The `[backend]` section of the configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackendConfig {
    /// Where the backend listens; the gateway's `backend` upstream points here.
    pub listen: SocketAddr,
    /// Largest accepted request body, in bytes; larger ones get 413.
    pub max_body_bytes: u64,
    /// `group` (default): concurrent creates share one fsync. `per_request`: one each (benchmarks).
    pub commit: CommitMode,
    /// How long shutdown waits for requests in flight before closing their connections.
    pub shutdown_grace_seconds: u64,
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            listen: DEFAULT_LISTEN.parse().expect("valid default address"),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            commit: CommitMode::Group,
            shutdown_grace_seconds: DEFAULT_SHUTDOWN_GRACE_SECONDS,
        }
    }
}

/// Opens the store in `data_dir` and serves on `listener` until `shutdown` resolves; then stops
/// accepting, lets requests in flight finish (up to the grace time), and flushes to disk.
pub async fn run(
    config: &BackendConfig,
    data_dir: &Path,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StoreError> {
    std::fs::create_dir_all(data_dir).map_err(|e| StoreError::Sled(sled::Error::Io(e)))?;
    let store = Store::open(data_dir, config.commit)?;
    let limits = handlers::Limits {
        max_body_bytes: config.max_body_bytes,
    };
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let server = warp::serve(routes::routes(store.clone(), limits))
        .incoming(listener)
        .graceful(async move {
            shutdown.await;
            let _ = stopping_tx.send(());
        })
        .run();
    let grace = Duration::from_secs(config.shutdown_grace_seconds);
    tokio::pin!(server);
    tokio::select! {
        () = &mut server => {}
        _ = stopping_rx => {
            if tokio::time::timeout(grace, &mut server).await.is_err() {
                log::warn!("backend: requests still in flight after {grace:?}; closing them");
            }
        }
    }
    store.flush()?;
    log::info!("backend: stopped, data flushed");
    Ok(())
}
