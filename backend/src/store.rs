//! The pets store: sled trees behind a small API, with durable, group-committed creates.
//!
//! The sled layout, and what a create writes in which order, is in `store/trees.rs`.
//!
//! Durability: [`Store::create`] returns only after a flush of sled's log and an `fdatasync` of
//! it (`Trees::make_durable`) that began after the pet was written. Concurrent creates wait on
//! the same flush (group commit), run by one flusher task on a blocking thread (sled's
//! `flush_async` has known deadlocks); under load the flusher lets the creates that are ready to
//! run join a flush before it starts (`gather`).
//!
//! Faults: once sled hits an I/O error (a full disk, a read-only file system) it refuses every
//! further write, even after the cause is gone. The store then drops that database and reopens
//! it from disk, retrying every second; meanwhile requests get 503. Reopening recovers the last
//! durable state, so a create that was answered 503 does not linger in memory.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::errors::StoreError;
use crate::models::{ListQuery, NewPet, Pet};

mod trees;
use trees::Trees;

/// How long an idempotency key is remembered.
pub const IDEMPOTENCY_TTL_SECS: u64 = 24 * 3600;
/// At most how many times the flusher yields to gather more waiters before a flush.
const MAX_GATHER_YIELDS: usize = 8;
/// How often expired idempotency records are removed.
const IDEMPOTENCY_PURGE_INTERVAL: Duration = Duration::from_secs(3600);

/// A client's `Idempotency-Key`, scoped to the API key that sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey {
    /// The API key id the gateway forwarded (empty when called directly).
    pub scope: String,
    /// The client's key.
    pub key: String,
}

impl IdempotencyKey {
    fn storage_key(&self) -> Vec<u8> {
        // The scope is hex and the key printable ASCII: a newline cannot occur in either.
        format!("{}\n{}", self.scope, self.key).into_bytes()
    }
}

/// What a create did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// A new pet.
    New(Pet),
    /// The same request was made before with this idempotency key: its pet.
    Replayed(Pet),
    /// The idempotency key was used before for a different request.
    KeyReused,
}

/// Name of the sled database directory inside the data directory.
pub const DB_DIR: &str = "pets.sled";
/// How often a database poisoned by an I/O error is tried again.
const REOPEN_INTERVAL: Duration = Duration::from_secs(1);

/// How creates reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommitMode {
    /// Concurrent creates share one flush (the default).
    Group,
    /// Every create flushes on its own; only for measuring what group commit saves.
    PerRequest,
    /// NOT DURABLE: a create is acknowledged before it reaches the disk, which sled's own
    /// background flush (every 500 ms) does later; a crash loses what it had not flushed. Only
    /// the reference against which the durable modes are measured.
    None,
}

type FlushResult = Result<(), (io::ErrorKind, String)>;

struct Shared {
    data_dir: PathBuf,
    mode: CommitMode,
    /// `None` while the database is being reopened after an I/O failure.
    current: RwLock<Option<Arc<Trees>>>,
    recovering: AtomicBool,
    flush_requests: mpsc::UnboundedSender<oneshot::Sender<FlushResult>>,
    /// Flushes made for creates in group commit, for tests of the batching.
    group_flushes: AtomicU64,
}

/// The pets store. Cheap to clone; clones share the database and the flusher.
#[derive(Clone)]
pub struct Store {
    shared: Arc<Shared>,
}

impl Store {
    /// Opens (or creates) the store in `data_dir` and starts its flusher on the current runtime.
    pub fn open(data_dir: &Path, mode: CommitMode) -> Result<Store, StoreError> {
        let trees = Trees::open(data_dir)?;
        let (flush_requests, rx) = mpsc::unbounded_channel();
        let store = Store {
            shared: Arc::new(Shared {
                data_dir: data_dir.to_owned(),
                mode,
                current: RwLock::new(Some(Arc::new(trees))),
                recovering: AtomicBool::new(false),
                flush_requests,
                group_flushes: AtomicU64::new(0),
            }),
        };
        tokio::spawn(run_flusher(store.clone(), rx));
        tokio::spawn(store.clone().purge_idempotency_hourly());
        Ok(store)
    }

    /// Removes idempotency records older than 24 hours, so the tree does not grow with every
    /// key a client ever sent; returns how many went.
    pub fn purge_expired_idempotency(&self, now_unix: u64) -> Result<usize, StoreError> {
        self.trees()?.purge_expired_idempotency(now_unix)
    }

    async fn purge_idempotency_hourly(self) {
        let mut tick = tokio::time::interval(IDEMPOTENCY_PURGE_INTERVAL);
        tick.tick().await; // the first tick is immediate
        loop {
            tick.tick().await;
            let store = self.clone();
            let now = unix_now();
            match tokio::task::spawn_blocking(move || store.purge_expired_idempotency(now)).await {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => log::info!("store: purged {n} expired idempotency records"),
                Ok(Err(e)) => log::warn!("store: purging idempotency records failed: {e}"),
                Err(_) => return, // the runtime is shutting down
            }
        }
    }

    /// The database in use, or `Recovering` while it is being reopened.
    fn trees(&self) -> Result<Arc<Trees>, StoreError> {
        let current = self
            .shared
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner());
        current.clone().ok_or(StoreError::Recovering)
    }

    /// Notes a failure; an I/O error poisons sled, so it starts a reopen (once).
    fn failed(&self, error: StoreError) -> StoreError {
        if matches!(error, StoreError::Sled(sled::Error::Io(_)))
            && !self.shared.recovering.swap(true, Ordering::SeqCst)
        {
            log::error!("store: {error}; reopening the database from disk until that succeeds");
            tokio::spawn(self.clone().reopen());
        }
        error
    }

    /// Drops the poisoned database once no request holds it, then reopens it every second until
    /// the disk lets it.
    async fn reopen(self) {
        let old = self
            .shared
            .current
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(old) = old {
            while Arc::strong_count(&old) > 1 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let _ = tokio::task::spawn_blocking(move || drop(old)).await;
        }
        loop {
            let dir = self.shared.data_dir.clone();
            match tokio::task::spawn_blocking(move || Trees::open(&dir)).await {
                Ok(Ok(trees)) => {
                    *self
                        .shared
                        .current
                        .write()
                        .unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(trees));
                    self.shared.recovering.store(false, Ordering::SeqCst);
                    log::info!("store: database reopened; serving again");
                    return;
                }
                Ok(Err(e)) => log::warn!("store: cannot reopen the database yet: {e}"),
                Err(_) => return, // the runtime is shutting down
            }
            tokio::time::sleep(REOPEN_INTERVAL).await;
        }
    }

    /// Stores a new pet and returns it once it is durably on disk. With an idempotency key seen
    /// in the last 24 hours, returns the pet of that earlier request instead (also once it is
    /// durable), or [`Created::KeyReused`] if that request was a different one.
    pub async fn create(
        &self,
        new: NewPet,
        idempotency: Option<IdempotencyKey>,
        now_unix: u64,
    ) -> Result<Created, StoreError> {
        // Inline, not on a blocking thread: sled inserts into memory (the disk is the flusher's
        // business), in microseconds, and a hand-off to another thread per create cost more than
        // the insert (creates with `commit = "none"`: 15.9k/s handed off, 35k/s inline).
        let created = self
            .trees()?
            .insert(new, idempotency, now_unix)
            .map_err(|e| self.failed(e))?;
        if created != Created::KeyReused {
            self.wait_durable().await.map_err(|e| self.failed(e))?;
        }
        Ok(created)
    }

    async fn wait_durable(&self) -> Result<(), StoreError> {
        let result = match self.shared.mode {
            CommitMode::Group => {
                let (tx, rx) = oneshot::channel();
                self.shared
                    .flush_requests
                    .send(tx)
                    .map_err(|_| StoreError::ShuttingDown)?;
                rx.await.map_err(|_| StoreError::ShuttingDown)?
            }
            CommitMode::PerRequest => {
                let trees = self.trees()?;
                tokio::task::spawn_blocking(move || flush(&trees))
                    .await
                    .map_err(|_| StoreError::ShuttingDown)?
            }
            CommitMode::None => Ok(()),
        };
        result.map_err(|(kind, msg)| StoreError::Sled(sled::Error::Io(io::Error::new(kind, msg))))
    }

    /// One pet by id, if it exists.
    pub fn get(&self, id: i64) -> Result<Option<Pet>, StoreError> {
        self.trees()?.get(id)
    }

    /// A page of pets in id order after `query.after`, plus whether more remain.
    pub fn list(&self, query: &ListQuery) -> Result<(Vec<Pet>, bool), StoreError> {
        self.trees()?.list(query)
    }

    /// Flushes everything to disk; used at shutdown.
    pub fn flush(&self) -> Result<(), StoreError> {
        Ok(self.trees()?.make_durable()?)
    }
}

fn flush(trees: &Trees) -> FlushResult {
    trees.make_durable().map_err(|e| match e {
        sled::Error::Io(io) => (io.kind(), io.to_string()),
        other => (io::ErrorKind::Other, other.to_string()),
    })
}

/// Serves flush requests: takes every waiter queued so far, flushes once, answers them all.
/// Waiters that arrive during a flush are served by the next one, which starts after their
/// writes, so every answer covers the writes made before its request.
async fn run_flusher(
    store: Store,
    mut requests: mpsc::UnboundedReceiver<oneshot::Sender<FlushResult>>,
) {
    let mut waiters = Vec::new();
    // Whether the last flush served more than one create: only then are others likely to be
    // on their way, and worth gathering for.
    let mut concurrent = false;
    while let Some(first) = requests.recv().await {
        waiters.push(first);
        gather(&mut requests, &mut waiters, concurrent).await;
        concurrent = waiters.len() > 1;
        store.shared.group_flushes.fetch_add(1, Ordering::Relaxed);
        let result = match store.trees() {
            Ok(trees) => tokio::task::spawn_blocking(move || flush(&trees))
                .await
                .unwrap_or_else(|_| Err((io::ErrorKind::Other, "flush task failed".to_owned()))),
            Err(_) => Err((
                io::ErrorKind::Other,
                "the database is being reopened".to_owned(),
            )),
        };
        for waiter in waiters.drain(..) {
            let _ = waiter.send(result.clone());
        }
    }
}

/// Takes the waiters queued so far and, when creates are `concurrent`, lets those that are
/// ready to run queue theirs too before the flush starts. A create that wakes the flusher puts
/// it first in line, ahead of the connections whose requests are already in: a flush started
/// then served 4-5 creates of 64 connections, and the flushes' own work halved the throughput
/// (bench/history.md). Each yield lets every ready task run once; gathering stops at the first
/// that brings no new waiter. A lone client does not pay for the yield (about 10% of its
/// creates per second).
async fn gather(
    requests: &mut mpsc::UnboundedReceiver<oneshot::Sender<FlushResult>>,
    waiters: &mut Vec<oneshot::Sender<FlushResult>>,
    concurrent: bool,
) {
    let mut drain = |waiters: &mut Vec<_>| {
        while let Ok(next) = requests.try_recv() {
            waiters.push(next);
        }
    };
    drain(waiters);
    if !concurrent {
        return;
    }
    for _ in 0..MAX_GATHER_YIELDS {
        let before = waiters.len();
        tokio::task::yield_now().await;
        drain(waiters);
        if waiters.len() == before {
            return;
        }
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("mode", &self.shared.mode)
            .finish()
    }
}

/// Unix seconds now.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
