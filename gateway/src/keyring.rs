//! The key set a running gateway uses, kept fresh from its key store: the file in the data
//! directory, or Redis when `gateway.redis.url` is set.
//!
//! Requests read the current set through an `ArcSwap` (no lock, no I/O); a background service
//! checks the store's stamp every `key_refresh` (the file's identity, or the Redis version) and
//! swaps in a new set when it moved, so `keys` commands take effect without a restart. With
//! Redis, every set loaded is also copied to `keys-cache.json` in the data directory (hashes
//! only), so a gateway started while Redis is away still knows the keys it knew.

use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use futures_util::FutureExt;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::keys::{KeyError, KeyRecord, KeySet, KeyStore, new_key, revoke_in};
use crate::metrics;
use crate::plans::Plans;
use crate::redis_keys::RedisKeyStore;

/// File name of the local copy of the Redis key store.
pub const REDIS_CACHE_FILE: &str = "keys-cache.json";

/// What a store's content is stamped with; a change moves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stamp {
    /// The file's inode, size and modification time, if it exists.
    File(Option<(u64, u64, i64, i64)>),
    /// The Redis version counter.
    Redis(u64),
    /// Not read yet, or unreadable.
    Unknown,
}

/// Where keys are kept.
pub enum KeySource {
    /// `keys.json` in the data directory.
    File(KeyStore),
    /// Redis, with a local copy for starts while Redis is away.
    Redis {
        /// The shared records.
        store: RedisKeyStore,
        /// The local copy.
        cache: KeyStore,
    },
}

impl KeySource {
    /// Every record, revoked ones included.
    pub async fn load(&self) -> Result<Vec<KeyRecord>, KeyError> {
        match self {
            KeySource::File(store) => store.load(),
            KeySource::Redis { store, .. } => Ok(store.load().await?.1),
        }
    }

    /// Issues a key; returns its record and the key, which is never stored.
    pub async fn create(
        &self,
        plans: &Plans,
        plan: &str,
        name: Option<String>,
        per_minute: Option<u64>,
        per_day: Option<u64>,
    ) -> Result<(KeyRecord, String), KeyError> {
        match self {
            KeySource::File(store) => store.create(plans, plan, name, per_minute, per_day),
            KeySource::Redis { store, .. } => {
                let (record, key) = new_key(plans, plan, name, per_minute, per_day)?;
                store
                    .update(|keys| {
                        keys.push(record.clone());
                        Ok(())
                    })
                    .await?;
                Ok((record, key))
            }
        }
    }

    /// Revokes by id or by the key itself; returns the revoked record.
    pub async fn revoke(&self, id_or_key: &str) -> Result<KeyRecord, KeyError> {
        match self {
            KeySource::File(store) => store.revoke(id_or_key),
            KeySource::Redis { store, .. } => {
                let mut revoked = None;
                store
                    .update(|keys| {
                        revoked = Some(revoke_in(keys, id_or_key)?);
                        Ok(())
                    })
                    .await?;
                Ok(revoked.expect("set by the update"))
            }
        }
    }

    /// Runs one of this source's operations from code without a runtime (the command line and
    /// start-up): on the Redis hub's runtime, or at once for the file, which never waits.
    pub fn blocking<F: Future>(&self, operation: F) -> F::Output {
        match self {
            KeySource::File(_) => operation
                .now_or_never()
                .expect("file key store operations never wait"),
            KeySource::Redis { store, .. } => store.hub().block_on(operation),
        }
    }

    /// Where the keys are, for logs.
    pub fn describe(&self) -> String {
        match self {
            KeySource::File(store) => store.path().display().to_string(),
            KeySource::Redis { store, .. } => format!("redis at {}", store.hub().describe()),
        }
    }

    async fn stamp(&self) -> Stamp {
        match self {
            KeySource::File(store) => Stamp::File(file_stamp(store)),
            KeySource::Redis { store, .. } => {
                store.version().await.map_or(Stamp::Unknown, Stamp::Redis)
            }
        }
    }

    /// The records and their stamp, read together where the store allows.
    async fn load_stamped(&self) -> Result<(Stamp, Vec<KeyRecord>), KeyError> {
        match self {
            KeySource::File(store) => {
                let stamp = file_stamp(store);
                Ok((Stamp::File(stamp), store.load()?))
            }
            KeySource::Redis { store, cache } => {
                let (version, records) = store.load().await?;
                if let Err(e) = cache.replace_all(records.clone()) {
                    log::warn!("gateway: could not update the local copy of the keys: {e}");
                }
                Ok((Stamp::Redis(version), records))
            }
        }
    }
}

/// The live key set and what refreshes it.
pub struct Keyring {
    source: KeySource,
    plans: Mutex<Plans>,
    current: ArcSwap<KeySet>,
    stamp: Mutex<Stamp>,
    interval: Duration,
}

impl Keyring {
    /// Loads the store now. A file that cannot be read fails the start; Redis out of reach
    /// falls back to the local copy of its keys, and the refresh goes on trying Redis.
    pub fn load(
        source: KeySource,
        plans: Plans,
        interval: Duration,
    ) -> Result<Arc<Keyring>, KeyError> {
        let (stamp, records) = match source.blocking(source.load_stamped()) {
            Ok(loaded) => loaded,
            Err(e) => match &source {
                KeySource::Redis { cache, .. } => {
                    log::warn!(
                        "gateway: {e}; using the local copy {} until redis answers",
                        cache.path().display()
                    );
                    (Stamp::Unknown, cache.load()?)
                }
                KeySource::File(_) => return Err(e),
            },
        };
        let set = KeySet::build(&records, &plans);
        metrics::ACTIVE_KEYS.set(set.len() as i64);
        log::info!(
            "gateway: {} usable keys loaded from {}",
            set.len(),
            source.describe()
        );
        Ok(Arc::new(Keyring {
            source,
            plans: Mutex::new(plans),
            current: ArcSwap::from_pointee(set),
            stamp: Mutex::new(stamp),
            interval,
        }))
    }

    /// The key set in force now.
    pub fn current(&self) -> arc_swap::Guard<Arc<KeySet>> {
        self.current.load()
    }

    /// Reloads if the store changed. A failed read keeps the previous set and is logged.
    pub async fn refresh(&self) {
        let now = self.source.stamp().await;
        if now != Stamp::Unknown && now == *self.last_stamp() {
            return;
        }
        match self.source.load_stamped().await {
            Ok((stamp, records)) => {
                let plans = self.plans.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let set = KeySet::build(&records, &plans);
                log::info!("gateway: key store changed; {} usable keys", set.len());
                metrics::ACTIVE_KEYS.set(set.len() as i64);
                self.current.store(Arc::new(set));
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

fn file_stamp(store: &KeyStore) -> Option<(u64, u64, i64, i64)> {
    let meta = std::fs::metadata(store.path()).ok()?;
    Some((meta.ino(), meta.size(), meta.mtime(), meta.mtime_nsec()))
}

/// Runs [`Keyring::refresh`] every interval until shutdown.
pub struct KeyRefresh(pub Arc<Keyring>);

#[async_trait]
impl BackgroundService for KeyRefresh {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.0.interval);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => self.0.refresh().await,
            }
        }
    }
}
