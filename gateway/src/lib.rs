//! The Animal Store API gateway, on Cloudflare's pingora.
//!
//! Bearer-key authentication against a hashed key store, plans with exact per-key minute and
//! day limits, temporary bans, rate-limit and deprecation headers, and routing of path prefixes
//! to upstreams, all from configuration. [`run`] builds and runs the pingora server; the module
//! [`proxy`] shows the phases and what each decides.

pub mod access_log;
pub mod admin;
pub mod admission;
pub mod auth;
pub mod background;
pub mod bans;
pub mod client;
pub mod client_stream;
pub mod config;
pub mod connections;
pub mod context;
pub mod cors;
pub mod deprecation;
pub mod errors;
pub mod fail_to_proxy;
pub mod headers;
pub mod key_index;
pub mod key_set;
pub mod key_store;
pub mod keyring;
pub mod keys;
pub mod limits;
pub mod lingering;
pub mod metrics;
pub mod outcome;
pub mod pages;
pub mod pipeline;
pub mod plans;
pub mod proxy;
pub mod rate_headers;
pub mod redact;
pub mod redis_conn;
pub mod redis_keys;
pub mod reload;
pub mod request_id;
pub mod request_line;
pub mod retries;
pub mod routes;
pub mod secret_files;
pub mod settings;
mod slot_memory;
pub mod state_table;
pub mod store;
pub mod tls;

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::configuration::ServerConf;
use pingora::server::{RunArgs, Server, ShutdownSignal, ShutdownSignalWatch};
use pingora::services::background::background_service;
use pingora::services::listening::Service;
use tokio::sync::Mutex;
use tokio::sync::oneshot;

pub use config::GatewayConfig;
pub use key_store::KeyStore;
pub use keyring::KeySource;
pub use keys::{KeyError, KeyRecord, NewKey};
pub use reload::Reload;
pub use settings::Settings;
pub use tls::TlsError;

use keyring::REDIS_CACHE_FILE;
use redis_conn::{RedisError, RedisHub};
use redis_keys::RedisKeyStore;
use store::{EmbeddedStore, LimitStore, RedisStore};

use background::{Snapshots, UpstreamHealth};
use connections::{Connections, Port};
use pingora::listeners::ListenerConfig;
use pingora::protocols::l4::stream::L4BufferSettings;
use reload::Reloads;

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

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The key store could not be read.
    #[error(transparent)]
    Keys(#[from] KeyError),
    /// The limiter's snapshot could not be read.
    #[error(transparent)]
    Limits(#[from] store::embedded::SnapshotError),
    /// The data directory's limits are another process's, or cannot be locked.
    #[error(transparent)]
    LimitsLock(#[from] store::embedded::LockError),
    /// Redis could not be set up (not: could not be reached, which is a fallback).
    #[error(transparent)]
    Redis(#[from] RedisError),
    /// The TLS certificate or key cannot be used.
    #[error("TLS: {0}")]
    Tls(#[from] tls::TlsError),
    /// No key for session tickets: the system's random numbers failed.
    #[error("TLS: cannot make a session ticket key: {0}")]
    TlsTickets(#[from] rustls::Error),
    /// A listener's address cannot be bound: in use, named twice, or not this machine's.
    #[error("cannot listen on {address} ({flag})")]
    Listen {
        /// The address, as configured.
        address: SocketAddr,
        /// The command-line flag that sets it.
        flag: &'static str,
        /// Why it cannot be bound.
        source: std::io::Error,
    },
}

/// The key store of these settings: Redis when configured, else the data directory's file.
pub fn key_source(settings: &Settings, data_dir: &Path) -> Result<KeySource, StartError> {
    Ok(match &settings.redis {
        Some(redis) => KeySource::Redis {
            store: RedisKeyStore::new(RedisHub::start(redis.target.clone())?),
            cache: KeyStore::at(data_dir.join(REDIS_CACHE_FILE)),
        },
        None => KeySource::File(KeyStore::new(data_dir)),
    })
}

/// Runs the gateway until `stop` fires; blocks the calling thread. Keys and limits live in
/// `data_dir`, or in Redis when the settings name one.
pub fn run(
    settings: Settings,
    data_dir: &Path,
    stop: oneshot::Receiver<()>,
    reload: Reload,
) -> Result<(), StartError> {
    let certificate = match &settings.tls {
        Some((_, files)) => {
            let loaded = tls::CertResolver::load(files)?;
            for warning in files.exposed() {
                log::warn!("gateway: TLS: {warning}");
            }
            Some(loaded)
        }
        None => None,
    };
    let source = key_source(&settings, data_dir)?;
    // The embedded store's files are this process's alone while it runs.
    let _limits_lock = match &settings.redis {
        None => Some(store::embedded::lock(data_dir)?),
        Some(_) => None,
    };
    let limits = Arc::new(match (&source, &settings.redis) {
        (KeySource::Redis { store, .. }, Some(redis)) => LimitStore::Redis(RedisStore::start(
            store.hub().clone(),
            redis.timeout,
            redis.fallback,
        )),
        _ => LimitStore::Embedded(EmbeddedStore::open(data_dir, settings.bans)?),
    });
    let keyring = keyring::Keyring::load(source, settings.plans.clone(), settings.key_refresh)?;
    let conf = ServerConf {
        threads: settings.threads,
        grace_period_seconds: Some(settings.shutdown_grace_seconds),
        graceful_shutdown_timeout_seconds: Some(RUNTIME_SHUTDOWN_SECONDS),
        // As nginx's workers do, each thread keeps the connections it was given: no stealing of
        // tasks between threads (6% more requests a second on one core: commit 2935002).
        work_stealing: false,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let stopping = Arc::new(AtomicBool::new(false));
    let settings = Arc::new(settings);
    let live = Arc::new(ArcSwap::new(settings.clone()));

    let gateway = proxy::Gateway::new(live.clone(), keyring.clone(), limits.clone());
    let refusals = gateway.early_refusals();
    let mut connections = Connections::new(
        pingora_proxy::http_proxy(&server.configuration, gateway),
        live.clone(),
        Port::Public,
    )
    .with_refusals(refusals);
    if let Some(app) = connections.app_mut() {
        let mut options = pingora::apps::HttpServerOptions::default();
        options.h2_idle_timeout = Some(settings.keepalive_timeout);
        app.server_options = Some(options);
        // Each thread keeps the idle upstream connections it used, as many as pingora's pool
        // would hold, and takes them back with no lock, task or system call (1.4 µs a GET less
        // in an A/B: `vendor/README.md`). Each thread runs a runtime of its own (no work
        // stealing), so each thread's once-a-second sweep of what it keeps runs on that thread.
        app.kept_upstreams = Some(server.configuration.upstream_keepalive_pool_size);
    }
    let mut public = Service::new("gateway".to_owned(), connections);
    // pingora's default 64 KiB read buffer would stay resident in every idle connection. The
    // HTTP/1 parser reads a head into its own buffer, which lives as long as the request, and
    // the wait for the next request reads into room that lives only while it reads
    // ([`client_stream`]), so the transport has no read buffer. Writes are buffered above the
    // transport too, only while a response is written.
    public.add_listener(
        ListenerConfig::tcp(settings.listen.to_string()).l4_buffer(L4BufferSettings::unbuffered()),
    );
    if let (Some((listen, files)), Some(certificate)) = (&settings.tls, &certificate) {
        // rustls reads whole records into its own buffer, 4 KiB and more at a time: a read
        // buffer under it would only be copied through (or bypassed) and stay resident. Writes
        // are gathered above TLS, so a response leaves as one record.
        public.add_listener(
            ListenerConfig::tcp(listen.to_string())
                .tls(certificate.listener_settings(files.min_version)?)
                .l4_buffer(L4BufferSettings::unbuffered()),
        );
    }
    let mut admin = Service::new(
        "admin".to_owned(),
        Connections::new(
            admin::Admin {
                stopping: stopping.clone(),
                live: live.clone(),
                keys: keyring.clone(),
            },
            live.clone(),
            Port::Admin,
        ),
    );
    // As the public listener's: no buffer in the transport ([`client_stream`]).
    admin.add_listener(
        ListenerConfig::tcp(settings.admin_listen.to_string())
            .l4_buffer(L4BufferSettings::unbuffered()),
    );
    admin.threads = Some(1);
    let refresh = background_service("key refresh", keyring::KeyRefresh(keyring.clone()));
    let upkeep = background_service("limit snapshots", Snapshots(limits.clone()));
    let health = background_service("upstream health", UpstreamHealth(live.clone()));
    let reloads = background_service(
        "reload on SIGHUP",
        Reloads {
            reload,
            certificate,
            live,
            keyring,
            limits: limits.clone(),
        },
    );

    server.add_service(public);
    server.add_service(admin);
    server.add_service(refresh);
    server.add_service(upkeep);
    server.add_service(reloads);
    server.add_service(health);
    check_listeners(&settings)?;
    log::info!(
        "gateway listening on http://{} (admin on http://{})",
        settings.listen,
        settings.admin_listen
    );
    if let Some((listen, _)) = &settings.tls {
        log::info!("gateway listening on https://{listen} (HTTP/2 and HTTP/1.1)");
    }
    server.run(RunArgs {
        shutdown_signal: Box::new(StopSignal {
            receiver: Mutex::new(Some(stop)),
            stopping,
        }),
    });
    limits.persist();
    if let LimitStore::Redis(store) = &*limits {
        store.leave();
    }
    log::info!("gateway: stopped");
    Ok(())
}

/// Binds each listener's address once and lets it go, so that one that cannot be bound stops
/// the start with its name. pingora binds them only when the server runs, and an address in use
/// makes it retry for 30 s and then panic inside a task, leaving the process up without the
/// listener. The addresses are held together, so two settings naming one address fail too.
pub fn check_listeners(settings: &Settings) -> Result<(), StartError> {
    let mut addresses = vec![
        (settings.listen, "--listen"),
        (settings.admin_listen, "--admin-listen"),
    ];
    if let Some((listen, _)) = &settings.tls {
        addresses.push((*listen, "--tls-listen"));
    }
    let mut held = Vec::with_capacity(addresses.len());
    for (address, flag) in addresses {
        let listener = TcpListener::bind(address).map_err(|source| StartError::Listen {
            address,
            flag,
            source,
        })?;
        held.push(listener);
    }
    Ok(())
}

/// Unix milliseconds now.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
