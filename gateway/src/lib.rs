//! The Animal Store API gateway, on Cloudflare's pingora.
//!
//! Bearer-key authentication against a hashed key store, plans with exact per-key minute and
//! day limits, temporary bans, rate-limit and deprecation headers, and routing of path prefixes
//! to upstreams, all from configuration. [`run`] builds and runs the pingora server; the module
//! [`proxy`] shows the phases and what each decides.

pub mod admin;
pub mod auth;
pub mod bans;
pub mod config;
pub mod deprecation;
pub mod errors;
pub mod headers;
pub mod keyring;
pub mod keys;
pub mod limits;
pub mod metrics;
pub mod plans;
pub mod proxy;
pub mod routes;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use pingora::server::configuration::ServerConf;
use pingora::server::{RunArgs, Server, ShutdownSignal, ShutdownSignalWatch};
use pingora::services::background::background_service;
use pingora::services::listening::Service;
use tokio::sync::Mutex;
use tokio::sync::oneshot;

pub use config::{GatewayConfig, Settings};
pub use keys::{KeyError, KeyRecord, KeyStore};

/// Time pingora gives its runtimes to finish after the grace period.
const RUNTIME_SHUTDOWN_SECONDS: u64 = 5;

/// Tells pingora to shut down gracefully when the sender fires (or is dropped), and marks the
/// gateway as not ready so `/readyz` turns 503 at once.
pub struct StopSignal {
    receiver: Mutex<Option<oneshot::Receiver<()>>>,
    stopping: Arc<AtomicBool>,
}

#[async_trait]
impl ShutdownSignalWatch for StopSignal {
    async fn recv(&self) -> ShutdownSignal {
        if let Some(receiver) = self.receiver.lock().await.take() {
            let _ = receiver.await;
        }
        self.stopping.store(true, Ordering::Relaxed);
        ShutdownSignal::GracefulTerminate
    }
}

/// Runs the gateway until `stop` fires; blocks the calling thread. Keys come from the key
/// store in `data_dir`.
pub fn run(
    settings: Settings,
    data_dir: &Path,
    stop: oneshot::Receiver<()>,
) -> Result<(), KeyError> {
    let keyring = keyring::Keyring::load(
        KeyStore::new(data_dir),
        settings.plans.clone(),
        settings.key_refresh,
    )?;
    let conf = ServerConf {
        threads: settings.threads,
        grace_period_seconds: Some(settings.shutdown_grace_seconds),
        graceful_shutdown_timeout_seconds: Some(RUNTIME_SHUTDOWN_SECONDS),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let stopping = Arc::new(AtomicBool::new(false));
    let settings = Arc::new(settings);

    let mut public = pingora_proxy::http_proxy_service(
        &server.configuration,
        proxy::Gateway::new(settings.clone(), keyring.clone()),
    );
    public.add_tcp(&settings.listen.to_string());
    let mut admin = Service::new(
        "admin".to_owned(),
        admin::Admin {
            stopping: stopping.clone(),
        },
    );
    admin.add_tcp(&settings.admin_listen.to_string());
    admin.threads = Some(1);
    let refresh = background_service("key refresh", keyring::KeyRefresh(keyring));

    server.add_service(public);
    server.add_service(admin);
    server.add_service(refresh);
    log::info!(
        "gateway listening on http://{} (admin on http://{})",
        settings.listen,
        settings.admin_listen
    );
    server.run(RunArgs {
        shutdown_signal: Box::new(StopSignal {
            receiver: Mutex::new(Some(stop)),
            stopping,
        }),
    });
    log::info!("gateway: stopped");
    Ok(())
}
