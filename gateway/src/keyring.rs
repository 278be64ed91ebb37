//! The key set a running gateway uses, kept fresh from its key store: the file in the data
//! directory, or Redis when `gateway.redis.url` is set.
//!
//! Requests read the current set through an `ArcSwap` (no lock, no I/O); a background service
//! checks the store's stamp every `key_refresh` (the file's identity, or the Redis version) and
//! swaps in a new set when it moved, so `keys` commands take effect without a restart. With
//! Redis, every set loaded is also copied to `keys-cache.json` in the data directory (hashes
//! only), so a gateway started while Redis is away still knows the keys it knew, and a running
//! gateway can write back records that Redis lost.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use futures_util::FutureExt;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::key_set::KeySet;
use crate::key_store::KeyStore;
use crate::keys::{KeyError, KeyId, KeyRecord, NewKey, new_key, revoke_in, rotate_in};
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

    /// Issues a key as `new` asks; returns its record and the key, which is never stored.
    pub async fn create(
        &self,
        plans: &Plans,
        new: NewKey,
    ) -> Result<(KeyRecord, String), KeyError> {
        match self {
            KeySource::File(store) => store.create(plans, new),
            KeySource::Redis { store, .. } => {
                let (record, key) = new_key(plans, new)?;
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

    /// Issues the successor of a key, sharing its counters; the old key works for `overlap`.
    pub async fn rotate(
        &self,
        id_or_key: &str,
        overlap: Duration,
    ) -> Result<(KeyRecord, String), KeyError> {
        match self {
            KeySource::File(store) => store.rotate(id_or_key, overlap),
            KeySource::Redis { store, .. } => {
                let mut rotated = None;
                store
                    .update(|keys| {
                        rotated = Some(rotate_in(keys, id_or_key, overlap)?);
                        Ok(())
                    })
                    .await?;
                Ok(rotated.expect("set by the update"))
            }
        }
    }

    /// When each key was last used (Unix seconds, to the minute).
    pub async fn last_used(&self) -> Result<std::collections::HashMap<String, u64>, KeyError> {
        match self {
            KeySource::File(store) => Ok(store.last_used()),
            KeySource::Redis { store, .. } => store.last_used().await,
        }
    }

    async fn record_use(&self, uses: &[(String, u64)]) -> Result<(), KeyError> {
        match self {
            KeySource::File(store) => store.record_use(uses),
            KeySource::Redis { store, .. } => store.record_use(uses).await,
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
    ///
    /// With Redis, `last_version` is the version this process last loaded from it, when the
    /// local copy holds that load. Every change moves the version up and records are never
    /// deleted (a revoked key keeps its record), so a version below it means Redis lost data:
    /// restarted without persistence, flushed, or failed over to a replica that had not seen
    /// it. Records of the copy that Redis no longer has are then written back (a revoked one
    /// over one that is not) before the set is taken, so clients' keys keep working. Not at a
    /// start: a data directory's copy may be of another Redis.
    async fn load_stamped(
        &self,
        last_version: Option<u64>,
    ) -> Result<(Stamp, Vec<KeyRecord>), KeyError> {
        match self {
            KeySource::File(store) => {
                let stamp = file_stamp(store);
                Ok((Stamp::File(stamp), store.load()?))
            }
            KeySource::Redis { store, cache } => {
                let (mut version, mut records) = store.load().await?;
                if last_version.is_some_and(|last| version < last) {
                    let present: HashSet<&str> = records.iter().map(|r| r.id.as_str()).collect();
                    let held = cache.load().unwrap_or_else(|e| {
                        log::warn!("gateway: cannot read the local copy of the keys: {e}");
                        Vec::new()
                    });
                    let lost: Vec<KeyRecord> = held
                        .into_iter()
                        .filter(|r| !present.contains(r.id.as_str()))
                        .collect();
                    if !lost.is_empty() {
                        let written = store.restore(&lost).await?;
                        metrics::KEY_RECORDS_RESTORED.inc_by(written);
                        log::error!(
                            "gateway: {} lost {} of the key records this gateway had loaded from it (restarted without persistence, flushed, or failed over to a replica behind it); wrote {written} back from {}",
                            self.describe(),
                            lost.len(),
                            cache.path().display()
                        );
                        (version, records) = store.load().await?;
                    }
                }
                if let Err(e) = cache.replace_all(records.clone()) {
                    // A copy behind Redis must not be used: not at a start while Redis is away
                    // (a key revoked since would work), not to restore (it would come back).
                    let removed = match std::fs::remove_file(cache.path()) {
                        Ok(()) => "removed it, so that no stale copy is used",
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "there is none",
                        Err(_) => "and could not remove it either",
                    };
                    log::warn!(
                        "gateway: could not update the local copy of the keys: {e}; {removed}"
                    );
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

fn file_stamp(store: &KeyStore) -> Option<(u64, u64, i64, i64)> {
    let meta = std::fs::metadata(store.path()).ok()?;
    Some((meta.ino(), meta.size(), meta.mtime(), meta.mtime_nsec()))
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
