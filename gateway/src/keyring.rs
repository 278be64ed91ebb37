//! The key set a running gateway uses, kept fresh from its key store: the file in the data
//! directory, or Redis when `gateway.redis.url` is set.
//!
//! Requests read the current set through an `ArcSwap` (no lock, no I/O); a background service
//! checks the store's stamp every `key_refresh` (the file's identity, or the Redis version) and
//! swaps in a new set when it moved, so `keys` commands take effect without a restart. With
//! Redis, every set loaded is also copied to `keys-cache.json` in the data directory (hashes
//! only), so a gateway started while Redis is away still knows the keys it knew, and a running
//! gateway can write back records that Redis lost.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::key_set::KeySet;
use crate::keys::{KeyError, KeyId};
use crate::metrics;
use crate::plans::Plans;

mod source;

use source::Stamp;
pub use source::{KeySource, REDIS_CACHE_FILE};

/// The live key set and what refreshes it.
pub struct Keyring {
    source: KeySource,
    plans: Mutex<Plans>,
    /// The last use of each key already written to the store (Unix minutes).
    recorded: Mutex<std::collections::HashMap<KeyId, u64>>,
    current: ArcSwap<KeySet>,
    stamp: Mutex<Stamp>,
    interval: Duration,
    /// The Redis version this process last loaded (and copied locally), plus one; 0: none.
    loaded_version: AtomicU64,
    /// Whether the set in force was read from the store or from a local copy of it. Not when
    /// Redis could not be reached at the start and there was no copy: the empty set then says
    /// nothing about a key, which must not be told it is invalid.
    loaded: AtomicBool,
}

impl Keyring {
    /// Loads the store now. A file that cannot be read fails the start; Redis out of reach
    /// falls back to the local copy of its keys, and the refresh goes on trying Redis.
    pub fn load(
        source: KeySource,
        plans: Plans,
        interval: Duration,
    ) -> Result<Arc<Keyring>, KeyError> {
        let (stamp, records, loaded) = match source.blocking(source.load_stamped(None)) {
            Ok((stamp, records)) => (stamp, records, true),
            Err(e) => match &source {
                KeySource::Redis { cache, .. } => match cache.load_existing()? {
                    Some(records) => {
                        log::warn!(
                            "gateway: {e}; using the local copy {} until redis answers",
                            cache.path().display()
                        );
                        (Stamp::Unknown, records, true)
                    }
                    None => {
                        log::warn!(
                            "gateway: {e}, and there is no local copy of the keys ({}): until \
                             redis answers, requests with a key get 503 unavailable and /readyz \
                             503",
                            cache.path().display()
                        );
                        (Stamp::Unknown, Vec::new(), false)
                    }
                },
                KeySource::File(_) => return Err(e),
            },
        };
        let set = KeySet::build(&records, &plans);
        metrics::ACTIVE_KEYS.set(set.len() as i64);
        metrics::KEY_LOADS.inc();
        log::info!(
            "gateway: usable keys loaded from {}: {}",
            source.describe(),
            set.len()
        );
        Ok(Arc::new(Keyring {
            source,
            plans: Mutex::new(plans),
            recorded: Mutex::new(std::collections::HashMap::new()),
            current: ArcSwap::from_pointee(set),
            loaded_version: AtomicU64::new(match stamp {
                Stamp::Redis(version) => version + 1,
                _ => 0,
            }),
            stamp: Mutex::new(stamp),
            interval,
            loaded: AtomicBool::new(loaded),
        }))
    }

    /// The key set in force now.
    pub fn current(&self) -> arc_swap::Guard<Arc<KeySet>> {
        self.current.load()
    }

    /// Whether a set of keys is in force: false only from a start that could read neither
    /// Redis nor a local copy of its keys until Redis first answers.
    pub fn loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// Reloads if the store changed. A failed read keeps the previous set and is logged.
    pub async fn refresh(&self) {
        let now = self.source.stamp().await;
        if now != Stamp::Unknown && now == *self.last_stamp() {
            return;
        }
        let last_version = self.loaded_version.load(Ordering::Relaxed).checked_sub(1);
        match self.source.load_stamped(last_version).await {
            Ok((stamp, records)) => {
                let plans = self.plans.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let set = KeySet::build(&records, &plans);
                // Uses seen by the set being replaced are not lost with it.
                for old in self.current().keys() {
                    let minute = old
                        .last_used_minute
                        .load(std::sync::atomic::Ordering::Relaxed);
                    if let Some(new) = set.get(old.id) {
                        new.last_used_minute
                            .fetch_max(minute, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                log::info!("gateway: key store changed; usable keys: {}", set.len());
                metrics::ACTIVE_KEYS.set(set.len() as i64);
                metrics::KEY_LOADS.inc();
                self.current.store(Arc::new(set));
                // After the set: whoever reads `loaded` true, then the set, reads this one.
                self.loaded.store(true, Ordering::Release);
                if let Stamp::Redis(version) = stamp {
                    self.loaded_version.store(version + 1, Ordering::Relaxed);
                }
                *self.last_stamp() = stamp;
            }
            Err(e) => {
                metrics::KEY_RELOAD_FAILURES.inc();
                if *self.last_stamp() != Stamp::Unknown {
                    log::error!("gateway: keeping the previous keys: {e}");
                }
                *self.last_stamp() = Stamp::Unknown;
            }
        }
    }

    /// Writes the keys' last uses seen since the last call to the store, to the minute.
    pub async fn record_uses(&self) {
        let uses: Vec<(String, u64)> = {
            let mut recorded = self.recorded.lock().unwrap_or_else(|p| p.into_inner());
            self.current()
                .keys()
                .filter_map(|k| {
                    let minute = k
                        .last_used_minute
                        .load(std::sync::atomic::Ordering::Relaxed);
                    let before = recorded.insert(k.id, minute).unwrap_or(0);
                    (minute > before).then(|| (k.id.to_string(), minute * 60))
                })
                .collect()
        };
        if let Err(e) = self.source.record_use(&uses).await {
            log::warn!("gateway: could not record when keys were last used: {e}");
        }
    }

    /// New plans from a reload: the key set is rebuilt with them at once, so a plan's new limits
    /// apply to every key on it. Counts already made are kept (they live in the limit store).
    pub async fn set_plans(&self, plans: Plans) {
        *self.plans.lock().unwrap_or_else(|p| p.into_inner()) = plans;
        *self.last_stamp() = Stamp::Unknown;
        self.refresh().await;
    }

    fn last_stamp(&self) -> std::sync::MutexGuard<'_, Stamp> {
        self.stamp.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How often the keys' last uses are written to the store.
const RECORD_USES_EVERY: Duration = Duration::from_secs(60);

/// Runs [`Keyring::refresh`] every interval, and [`Keyring::record_uses`] every minute and at
/// shutdown.
pub struct KeyRefresh(pub Arc<Keyring>);

#[async_trait]
impl BackgroundService for KeyRefresh {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.0.interval);
        let mut uses = tokio::time::interval(RECORD_USES_EVERY);
        loop {
            tokio::select! {
                _ = shutdown.changed() => {
                    self.0.record_uses().await;
                    return;
                }
                _ = tick.tick() => self.0.refresh().await,
                _ = uses.tick() => self.0.record_uses().await,
            }
        }
    }
}
