//! The embedded limit store: state in this process's memory, each decision made under the lock
//! of its key's shard of the map, and persisted to the data directory, never on the request path.
//!
//! Once a second, when anything changed, a background task appends the states of the keys that
//! changed since the last write to a journal (`limits.journal`) and syncs it; the gateway
//! writes a last batch when it stops. So SIGTERM or SIGINT forget nothing and SIGKILL forgets
//! at most the last second of counts, and a second in which a thousand of a million keys were
//! used writes a thousand records, not a million. When the journal has grown past the size of
//! a full snapshot, the states are compacted into `limits.bin`: written whole to a temporary
//! file, synced and renamed over the old one; then the journal starts again, the same way.
//!
//! The snapshot and the journal carry a generation number. A journal is replayed only over the
//! snapshot of its own generation, so a crash between writing a new snapshot and starting the
//! new journal cannot replay the old journal's records over newer state. A batch ends with a
//! checksum: a batch cut short by a crash is where replay stops. Keys whose windows are over
//! and whose ban history no longer matters are left out of snapshots.
//!
//! The files are one gateway's: it holds `limits.lock` while it runs ([`lock`]), so a second
//! gateway on the same directory, which would count apart and write over them, cannot start.
//! How the two files are laid out is [`super::limits_file`]'s.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::limits_file::{batch, batch_len, decode, encode, journal_header, replay};
use crate::bans::BanPolicy;
use crate::keys::KeyId;
use crate::limits::{Decision, Limiter, Standing};
use crate::metrics;
use crate::plans::Limits;

/// File name of the snapshot inside the data directory.
pub const SNAPSHOT_FILE: &str = "limits.bin";
/// File name of the journal of changes since the snapshot.
pub const JOURNAL_FILE: &str = "limits.journal";
/// File name of the lock that keeps a second gateway off the same files.
pub const LOCK_FILE: &str = "limits.lock";
/// A journal smaller than this is never compacted: a few keys would otherwise rewrite the
/// snapshot every few seconds.
const MIN_COMPACTION_BYTES: u64 = 1 << 20;
/// Why the limiter state could not be written.
#[derive(Debug, thiserror::Error)]
#[error("limiter state {path}: {error}")]
pub struct SnapshotError {
    path: PathBuf,
    /// Part of the message, not a source, so that it is printed once.
    error: std::io::Error,
}

/// Why this process cannot have the data directory's limits.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds them.
    #[error(
        "the data directory {dir} is in use by another gateway ({holder}). Each keeps its own \
         counts, so two on one directory would each admit a key's whole limit: give each its \
         own --data-dir, or share limits through --redis-url"
    )]
    InUse {
        /// The data directory.
        dir: PathBuf,
        /// Who holds it, as far as the lock file says.
        holder: String,
    },
    /// The lock file cannot be made or locked.
    #[error("data directory {dir}: cannot lock {LOCK_FILE}")]
    Io {
        /// The data directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Takes the data directory's limits for this process, for as long as the returned file stays
/// open; the system lets go of it when the process ends, however it ends. The file holds the
/// holder's process id, for the error a second gateway gets.
pub fn lock(data_dir: &Path) -> Result<File, LockError> {
    let io = |source| LockError::Io {
        dir: data_dir.to_owned(),
        source,
    };
    fs::create_dir_all(data_dir).map_err(io)?;
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(data_dir.join(LOCK_FILE))
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let holder = fs::read_to_string(data_dir.join(LOCK_FILE))
                .ok()
                .and_then(|pid| pid.trim().parse::<u32>().ok())
                .map_or_else(
                    || "another process".to_owned(),
                    |pid| format!("process {pid}"),
                );
            return Err(LockError::InUse {
                dir: data_dir.to_owned(),
                holder,
            });
        }
        Err(TryLockError::Error(source)) => return Err(io(source)),
    }
    file.set_len(0)
        .and_then(|()| write!(file, "{}", std::process::id()))
        .map_err(io)?;
    Ok(file)
}

/// What the files hold, as far as the next write needs to know.
struct Files {
    /// Generation of the snapshot and of the journal that goes with it.
    generation: u64,
    /// The open journal, if it is in a state to be appended to.
    journal: Option<File>,
    /// Bytes in the journal.
    journal_bytes: u64,
    /// Bytes in the snapshot.
    snapshot_bytes: u64,
}

/// Limits in memory, persisted to the data directory.
pub struct EmbeddedStore {
    limiter: Limiter,
    dir: PathBuf,
    dirty: AtomicBool,
    files: Mutex<Files>,
    /// The ban rules the last request came with: what "idle" means for a snapshot.
    bans: Mutex<BanPolicy>,
}

impl EmbeddedStore {
    /// Opens the store in `data_dir`, restoring the last snapshot and replaying its journal. A
    /// damaged snapshot is moved aside (`limits.bin.damaged`) and logged, and the store starts
    /// empty: refusing to start would take the whole API down for the sake of some counters.
    pub fn open(data_dir: &Path, bans: BanPolicy) -> Result<EmbeddedStore, SnapshotError> {
        let path = data_dir.join(SNAPSHOT_FILE);
        let err = |error| SnapshotError {
            path: path.clone(),
            error,
        };
        let limiter = Limiter::new();
        let mut generation = 0;
        match fs::read(&path) {
            Ok(bytes) => match decode(&bytes) {
                Some((snapshot_generation, states)) => {
                    generation = snapshot_generation;
                    log::info!(
                        "gateway: limiter state of {} keys restored from {}",
                        states.len(),
                        path.display()
                    );
                    limiter.restore(states);
                }
                None => {
                    let aside = path.with_extension("bin.damaged");
                    log::error!(
                        "gateway: {} is damaged; moved to {} and starting with fresh counts",
                        path.display(),
                        aside.display()
                    );
                    fs::rename(&path, &aside).map_err(err)?;
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(err(source)),
        }
        let journal_path = data_dir.join(JOURNAL_FILE);
        match fs::read(&journal_path) {
            Ok(bytes) => {
                let (journal_generation, changes) = replay(&bytes, generation);
                if !changes.is_empty() {
                    log::info!(
                        "gateway: {} changes replayed from {}",
                        changes.len(),
                        journal_path.display()
                    );
                }
                limiter.restore(changes);
                // The next snapshot's generation is above both files', so no journal left
                // over from a damaged snapshot can match it.
                generation = generation.max(journal_generation.unwrap_or(0));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(err(source)),
        }
        let store = EmbeddedStore {
            limiter,
            dir: data_dir.to_owned(),
            dirty: AtomicBool::new(false),
            // No journal to append to yet: the first write is a snapshot of what was restored.
            files: Mutex::new(Files {
                generation,
                journal: None,
                journal_bytes: 0,
                snapshot_bytes: 0,
            }),
            bans: Mutex::new(bans),
        };
        store.publish_size();
        Ok(store)
    }

    /// Sets the `/metrics` gauges of the table's keys and bytes.
    fn publish_size(&self) {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        metrics::LIMITER_KEYS.set(gauge(self.limiter.len()));
        metrics::LIMITER_BYTES.set(gauge(self.limiter.bytes()));
    }

    /// Checks and, if admitted, counts one request under `bans`.
    pub fn check(&self, key: KeyId, limits: Limits, bans: &BanPolicy, now_ms: u64) -> Decision {
        let decision = self.limiter.check(key, limits, bans, now_ms);
        if !self.dirty.load(Ordering::Relaxed) {
            self.dirty.store(true, Ordering::Relaxed);
        }
        decision
    }

    /// The ban rules a reload brought, for what the snapshot forgets as idle.
    pub fn set_bans(&self, bans: BanPolicy) {
        *self.bans.lock().unwrap_or_else(|p| p.into_inner()) = bans;
    }

    /// Where `key` stands, counting nothing.
    pub fn peek(&self, key: KeyId, limits: Limits, now_ms: u64) -> Standing {
        self.limiter.peek(key, limits, now_ms)
    }

    /// Writes the states that changed since the last write, if any: a journal batch, or a new
    /// snapshot when the journal has grown past one.
    pub fn persist(&self, now_ms: u64) -> Result<(), SnapshotError> {
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let bans = *self.bans.lock().unwrap_or_else(|p| p.into_inner());
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        let result = self.write(&mut files, &bans, now_ms);
        // The write's pass forgot the idle keys, and may have resized shards.
        self.publish_size();
        if result.is_err() {
            // The changes taken are written by no batch: the next write is a whole snapshot,
            // which also starts over from whatever torn batch reached the journal.
            self.dirty.store(true, Ordering::Relaxed);
            files.journal = None;
        }
        result
    }

    fn write(&self, files: &mut Files, bans: &BanPolicy, now_ms: u64) -> Result<(), SnapshotError> {
        // A journal batch of the changes, unless there is no journal to append to or the batch
        // would outgrow the snapshot: then the changes are dropped before the snapshot is
        // taken, which holds them too, so the two never take memory at once.
        let limit = files.snapshot_bytes.max(MIN_COMPACTION_BYTES);
        let appendable = files
            .journal
            .is_some()
            .then(|| self.limiter.changes(bans, now_ms))
            .filter(|changed| files.journal_bytes + batch_len(changed.len()) <= limit);
        let Some(changed) = appendable else {
            return self.compact(files, bans, now_ms);
        };
        if !changed.is_empty() {
            let journal = files
                .journal
                .as_mut()
                .expect("changes are taken only with a journal");
            let path = self.dir.join(JOURNAL_FILE);
            journal
                .write_all(&batch(&changed))
                .and_then(|()| journal.sync_data())
                .map_err(|error| SnapshotError { path, error })?;
            files.journal_bytes += batch_len(changed.len());
        }
        Ok(())
    }

    /// Writes every live state as a new snapshot and starts its journal.
    fn compact(
        &self,
        files: &mut Files,
        bans: &BanPolicy,
        now_ms: u64,
    ) -> Result<(), SnapshotError> {
        let generation = files.generation + 1;
        let snapshot = encode(generation, self.limiter.len(), |put| {
            self.limiter.snapshot(bans, now_ms, put)
        });
        self.replace(SNAPSHOT_FILE, &snapshot)?;
        let header = journal_header(generation);
        self.replace(JOURNAL_FILE, &header)?;
        let path = self.dir.join(JOURNAL_FILE);
        let journal = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|error| SnapshotError { path, error })?;
        files.generation = generation;
        files.journal = Some(journal);
        files.journal_bytes = header.len() as u64;
        files.snapshot_bytes = snapshot.len() as u64;
        Ok(())
    }

    /// Replaces the file `name` with `bytes`: a temporary file, synced and renamed over it, then
    /// the directory synced, so a crash leaves the old file or the new one.
    fn replace(&self, name: &str, bytes: &[u8]) -> Result<(), SnapshotError> {
        let path = self.dir.join(name);
        let err = |error| SnapshotError {
            path: path.clone(),
            error,
        };
        fs::create_dir_all(&self.dir).map_err(err)?;
        let tmp = self.dir.join(format!("{name}.tmp"));
        let mut file = File::create(&tmp).map_err(err)?;
        file.write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(err)?;
        fs::rename(&tmp, &path).map_err(err)?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(err)
    }
}

#[cfg(test)]
mod tests;
