//! The key set a running gateway uses, kept fresh from the key store file.
//!
//! Requests read the current set through an `ArcSwap` (no lock, no file access); a background
//! service checks the file's identity (inode, size, modification time) every `key_refresh`
//! and swaps in a new set when it changed. `keys create` and `keys revoke` replace the file by
//! rename, so a change is seen within one interval, without a restart.

use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::keys::{KeySet, KeyStore};
use crate::metrics;
use crate::plans::Plans;

/// The file's identity; a rename or rewrite changes it.
type Stamp = Option<(u64, u64, i64, i64)>;

/// The live key set and what refreshes it.
pub struct Keyring {
    store: KeyStore,
    plans: Plans,
    current: ArcSwap<KeySet>,
    stamp: Mutex<Stamp>,
    interval: Duration,
}

impl Keyring {
    /// Loads the store now; fails if it cannot be read at start.
    pub fn load(
        store: KeyStore,
        plans: Plans,
        interval: Duration,
    ) -> Result<Arc<Keyring>, crate::keys::KeyError> {
        let stamp = stamp(&store);
        let set = KeySet::build(&store.load()?, &plans);
        metrics::ACTIVE_KEYS.set(set.len() as i64);
        log::info!(
            "gateway: {} usable keys loaded from {}",
            set.len(),
            store.path().display()
        );
        Ok(Arc::new(Keyring {
            store,
            plans,
            current: ArcSwap::from_pointee(set),
            stamp: Mutex::new(stamp),
            interval,
        }))
    }

    /// The key set in force now.
    pub fn current(&self) -> arc_swap::Guard<Arc<KeySet>> {
        self.current.load()
    }

    /// Reloads if the file changed. A failed read keeps the previous set and is logged.
    pub fn refresh(&self) {
        let now = stamp(&self.store);
        let mut last = self
            .stamp
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if *last == now {
            return;
        }
        match self.store.load() {
            Ok(records) => {
                let set = KeySet::build(&records, &self.plans);
                log::info!("gateway: key store changed; {} usable keys", set.len());
                metrics::ACTIVE_KEYS.set(set.len() as i64);
                self.current.store(Arc::new(set));
                *last = now;
            }
            Err(e) => {
                metrics::KEY_RELOAD_FAILURES.inc();
                log::error!("gateway: keeping the previous keys: {e}");
            }
        }
    }
}

fn stamp(store: &KeyStore) -> Stamp {
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
                _ = tick.tick() => self.0.refresh(),
            }
        }
    }
}
