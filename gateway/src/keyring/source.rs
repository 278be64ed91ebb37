//! Where a gateway's keys are kept, [`KeySource`]: the file in the data directory, or Redis with
//! a local copy, and what each store's content is stamped with, so that a refresh reads the
//! keys again only when they moved.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use futures_util::FutureExt;

use crate::key_store::KeyStore;
use crate::keys::{KeyError, KeyRecord, NewKey, new_key, revoke_in, rotate_in};
use crate::metrics;
use crate::plans::Plans;
use crate::redis_keys::RedisKeyStore;

/// File name of the local copy of the Redis key store.
pub const REDIS_CACHE_FILE: &str = "keys-cache.json";

/// What a store's content is stamped with; a change moves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stamp {
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

    pub(super) async fn record_use(&self, uses: &[(String, u64)]) -> Result<(), KeyError> {
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

    pub(super) async fn stamp(&self) -> Stamp {
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
    pub(super) async fn load_stamped(
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

pub(super) fn file_stamp(store: &KeyStore) -> Option<(u64, u64, i64, i64)> {
    let meta = std::fs::metadata(store.path()).ok()?;
    Some((meta.ino(), meta.size(), meta.mtime(), meta.mtime_nsec()))
}
