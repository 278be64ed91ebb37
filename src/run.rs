//! Running the services: runtimes, listeners and signals. The services themselves live in the
//! `animal-store-backend` and `animal-store-gateway` crates.

use anyhow::Context;
use tokio::net::TcpListener;

use crate::config::FileConfig;

/// Resolves on SIGTERM or SIGINT: stop accepting, finish what is in flight, flush, exit 0.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => log::info!("SIGTERM received: shutting down"),
        _ = int.recv() => log::info!("SIGINT received: shutting down"),
    }
}

/// `animal-store backend`: the pets service alone, until a signal.
pub fn backend(config: &FileConfig) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let listener = bind_backend(config).await?;
        animal_store_backend::run(
            &config.backend,
            &config.data_dir,
            listener,
            shutdown_signal(),
        )
        .await
        .with_context(|| format!("backend with data directory {}", config.data_dir.display()))
    })
}

async fn bind_backend(config: &FileConfig) -> anyhow::Result<TcpListener> {
    let listener = TcpListener::bind(config.backend.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (--backend-listen)",
                config.backend.listen
            )
        })?;
    log::info!("backend listening on http://{}", listener.local_addr()?);
    Ok(listener)
}
