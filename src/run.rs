//! Running the services: runtimes, listeners and signals. The services themselves live in the
//! `animal-store-backend` and `animal-store-gateway` crates.

use std::thread::JoinHandle;

use animal_store_gateway::{NewKey, Reload, Settings};
use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

use crate::cli::Overrides;
use crate::config::FileConfig;
use crate::output;

/// Resolves on SIGTERM or SIGINT: stop accepting, finish what is in flight, flush, exit 0.
///
/// The handlers are installed when this is called, not when the future is first polled, so a
/// signal that arrives once the listeners are up is never met by the default action (death).
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    async move {
        tokio::select! {
            _ = term.recv() => log::info!("SIGTERM received: shutting down"),
            _ = int.recv() => log::info!("SIGINT received: shutting down"),
        }
    }
}

/// Counts SIGHUPs: each asks the gateway to re-read what it can reload. Installed before the
/// services start, since an unhandled SIGHUP would end the process.
pub fn reload_signal() -> watch::Receiver<u64> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = signal(SignalKind::hangup()).expect("SIGHUP handler");
    let (sender, receiver) = watch::channel(0u64);
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            log::info!("SIGHUP received: reloading");
            sender.send_modify(|n| *n += 1);
        }
    });
    receiver
}

/// SIGHUPs, and how to read the configuration again: the same file with the same command-line
/// overrides, validated whole.
fn reload(overrides: &Overrides) -> Reload {
    let overrides = overrides.clone();
    Reload {
        signal: reload_signal(),
        reread: Box::new(move || {
            let config = crate::config::load(&overrides).map_err(|e| e.to_string())?;
            config.gateway_settings()
        }),
    }
}

/// `animal-store backend`: the pets service alone, until a signal.
pub fn backend(config: &FileConfig) -> anyhow::Result<()> {
    tokio::runtime::Runtime::new()?.block_on(async {
        let signal = shutdown_signal();
        let _reload = reload_signal(); // the backend has nothing to reload, but must not die
        let listener = bind_backend(config).await?;
        run_backend(config, listener, signal).await
    })
}

/// `animal-store gateway`: the gateway alone, until a signal.
pub fn gateway(config: &FileConfig, overrides: &Overrides) -> anyhow::Result<()> {
    let settings = config.gateway_settings().map_err(anyhow::Error::msg)?;
    tokio::runtime::Runtime::new()?.block_on(async {
        let signal = shutdown_signal();
        let gateway = Gateway::start(settings, config, reload(overrides));
        tokio::select! {
            () = signal => {}
            () = gateway.ended() => {} // it failed: stop() returns why
        }
        gateway.stop().await
    })
}

/// `animal-store serve`: backend and gateway in one process. On a signal the gateway stops
/// first (finishing the requests it is proxying), then the backend, which flushes to disk.
pub fn serve(config: &FileConfig, overrides: &Overrides) -> anyhow::Result<()> {
    let settings = config.gateway_settings().map_err(anyhow::Error::msg)?;
    let runtime = tokio::runtime::Runtime::new()?;
    // Every listener first: a start that stops for a port in use has shown no key, which would
    // never be shown again.
    let listener = runtime.block_on(bind_backend(config))?;
    animal_store_gateway::check_listeners(&settings)?;
    issue_first_key(config, &settings)?;
    runtime.block_on(async {
        let signal = shutdown_signal();
        let (stop_backend, backend_stopped) = oneshot::channel::<()>();
        let backend = run_backend(config, listener, async {
            let _ = backend_stopped.await;
        });
        tokio::pin!(backend);
        let gateway = Gateway::start(settings, config, reload(overrides));
        let backend_ended = tokio::select! {
            () = signal => None,
            result = &mut backend => Some(result.and_then(|()| anyhow::bail!("the backend stopped"))),
            () = gateway.ended() => None, // it failed: stop() returns why
        };
        let gateway_result = gateway.stop().await;
        let _ = stop_backend.send(());
        let backend_result = match backend_ended {
            Some(result) => result,
            None => backend.await,
        };
        gateway_result.and(backend_result)
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

async fn run_backend(
    config: &FileConfig,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    animal_store_backend::run(&config.backend, &config.data_dir, listener, shutdown)
        .await
        .with_context(|| format!("backend with data directory {}", config.data_dir.display()))
}

/// The pingora server on its own thread, with the means to stop it and to notice it ended.
struct Gateway {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<anyhow::Result<()>>>,
    ended: tokio::sync::Mutex<oneshot::Receiver<()>>,
}

impl Gateway {
    fn start(settings: Settings, config: &FileConfig, reload: Reload) -> Gateway {
        let (stop, stop_rx) = oneshot::channel();
        let (ended_tx, ended) = oneshot::channel();
        let data_dir = config.data_dir.clone();
        let thread = std::thread::spawn(move || {
            let result =
                animal_store_gateway::run(settings, &data_dir, stop_rx, reload).context("gateway");
            let _ = ended_tx.send(());
            result
        });
        Gateway {
            stop: Some(stop),
            thread: Some(thread),
            ended: tokio::sync::Mutex::new(ended),
        }
    }

    /// Resolves if the gateway stops by itself (it failed to start).
    async fn ended(&self) {
        let _ = (&mut *self.ended.lock().await).await;
    }

    /// Asks for a graceful stop and waits for it.
    async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let thread = self.thread.take().expect("joined once");
        tokio::task::spawn_blocking(move || thread.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the gateway thread panicked"))?
    }
}

/// On first start with an empty key store, issues one Free key and prints it with a ready
/// `curl` line, so a newcomer can call the API at once. The key is never shown again; if stdout
/// cannot take it, it is revoked and the start goes on (`output::print_key`). A shared store
/// (Redis) out of reach is no reason not to start: the gateway says so itself.
fn issue_first_key(config: &FileConfig, settings: &Settings) -> anyhow::Result<()> {
    let store = animal_store_gateway::key_source(settings, &config.data_dir)?;
    let existing = store.blocking(store.load());
    match existing {
        Ok(keys) if !keys.is_empty() => return Ok(()),
        Ok(_) => {}
        Err(e) if settings.redis.is_some() => {
            log::warn!("no first-run key: {e}");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    }
    let first = NewKey {
        name: Some("first-run".to_owned()),
        ..NewKey::on("free")
    };
    let (record, key) = store.blocking(store.create(&settings.plans, first))?;
    let banner = format!(
        "No API keys yet, so one Free-plan key was issued (id {}). It is shown only this once:\n\n    {key}\n\nTry it:\n\n    curl -i -H 'Authorization: Bearer {key}' {url}/v1/pets\n\nThe API's reference is at {url}/v1/docs\n",
        record.id,
        url = settings.public_url
    );
    if let Err(e) = output::print_key(&store, &record, &banner) {
        log::warn!("{e}; issue one with `animal-store keys create --plan free`");
    }
    Ok(())
}
