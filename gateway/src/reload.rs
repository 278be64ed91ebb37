//! Reloading a running gateway on `SIGHUP`: the configuration file read again and validated
//! whole, the settings that need a restart kept, and the new snapshot swapped in.

use std::sync::Arc;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::sync::watch;

use crate::settings::Settings;
use crate::store::LimitStore;
use crate::{keyring, metrics, tls};

/// How a running gateway reloads: the SIGHUPs, and a way to read the configuration file again
/// (with the same command-line overrides) into validated settings.
pub struct Reload {
    /// Moves on every SIGHUP.
    pub signal: watch::Receiver<u64>,
    /// Reads and validates the configuration file again; the error says what and where.
    pub reread: Box<dyn Fn() -> Result<Settings, String> + Send + Sync>,
}

/// Re-reads what a `SIGHUP` asks for: the configuration file (routes, upstreams, plans, bans,
/// deprecations, timeouts, CORS, body and header limits), the TLS certificate and the session
/// ticket keys, from the files it names now. The new configuration is validated whole and
/// swapped in atomically; a file with any error changes nothing, is logged with what and where,
/// and is counted. Requests in flight finish with the configuration they started with;
/// connections stay open; counts stay in the limit store.
pub(crate) struct Reloads {
    pub(crate) reload: Reload,
    pub(crate) certificate: Option<Arc<tls::CertResolver>>,
    pub(crate) live: Arc<ArcSwap<Settings>>,
    pub(crate) keyring: Arc<keyring::Keyring>,
    pub(crate) limits: Arc<LimitStore>,
}

#[async_trait]
impl BackgroundService for Reloads {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut signal = self.reload.signal.clone();
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                changed = signal.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    self.reload().await;
                }
            }
        }
    }
}

impl Reloads {
    async fn reload(&self) {
        let old = self.live.load_full();
        let fresh = (self.reload.reread)().and_then(|mut fresh| {
            keep_restart_only(&old, &mut fresh);
            if let (Some(c), Some((_, files))) = (&self.certificate, &fresh.tls) {
                c.reload(files).map_err(|e| format!("TLS: {e}"))?;
                for warning in files.exposed() {
                    log::warn!("gateway: SIGHUP: TLS: {warning}");
                }
            }
            Ok(fresh)
        });
        match fresh {
            Ok(mut fresh) => {
                fresh.routes = fresh.routes.keeping_pools_of(&old.routes);
                self.keyring.set_plans(fresh.plans.clone()).await;
                if let LimitStore::Embedded(store) = &*self.limits {
                    store.set_bans(fresh.bans);
                }
                self.live.store(Arc::new(fresh));
                metrics::RELOADS.with_label_values(&["ok"]).inc();
                log::info!("gateway: SIGHUP: configuration reloaded");
            }
            Err(e) => {
                metrics::RELOADS.with_label_values(&["error"]).inc();
                log::error!(
                    "gateway: SIGHUP: the configuration was refused, the previous one stays in force: {e}"
                );
            }
        }
    }
}

/// Settings a running gateway cannot change (its listeners, threads, stores): kept from `old`,
/// with a warning if the file changed them.
fn keep_restart_only(old: &Settings, fresh: &mut Settings) {
    let mut ignored = Vec::new();
    if fresh.listen != old.listen || fresh.admin_listen != old.admin_listen {
        ignored.push("listen, admin_listen");
    }
    if fresh.threads != old.threads {
        ignored.push("threads");
    }
    if fresh.tls.as_ref().map(|t| t.0) != old.tls.as_ref().map(|t| t.0) {
        ignored.push("tls.listen");
    }
    if let (Some((_, old_files)), Some((_, files))) = (&old.tls, &fresh.tls)
        && files.min_version != old_files.min_version
    {
        ignored.push("tls.min_version");
    }
    if fresh.redis.as_ref().map(|r| &r.target) != old.redis.as_ref().map(|r| &r.target) {
        ignored.push("redis");
    }
    if fresh.auth_failures_per_minute != old.auth_failures_per_minute
        || fresh.key_refresh != old.key_refresh
    {
        ignored.push("auth_failures_per_minute, key_refresh_ms");
    }
    if !ignored.is_empty() {
        log::warn!(
            "gateway: SIGHUP: {} take effect only at a restart; the running values stay",
            ignored.join(", ")
        );
    }
    fresh.listen = old.listen;
    fresh.admin_listen = old.admin_listen;
    fresh.threads = old.threads;
    // The listener stays where it is, with its versions; its files are the fresh configuration's.
    fresh.tls = match (&old.tls, fresh.tls.take()) {
        (Some((listen, old_files)), Some((_, files))) => Some((
            *listen,
            tls::TlsFiles {
                min_version: old_files.min_version,
                ..files
            },
        )),
        (old, _) => old.clone(),
    };
    fresh.redis = old.redis.clone();
    fresh.auth_failures_per_minute = old.auth_failures_per_minute;
    fresh.key_refresh = old.key_refresh;
}
