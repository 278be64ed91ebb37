//! The embedded limit store: state in this process's memory, decided under one lock per key,
//! and snapshotted to `limits.bin` in the data directory, never on the request path.
//!
//! A background task writes the snapshot once a second when anything changed, and the gateway
//! writes a last one when it stops; so SIGTERM or SIGINT forget nothing and SIGKILL forgets at
//! most the last second of counts. A snapshot is written whole to a temporary file, synced and
//! renamed over the old one, so a crash during the write leaves the previous snapshot intact.
//! Keys whose windows are over and whose ban history no longer matters are left out.
//!
//! The file is little-endian `u64` words: a magic word, a count, then nine words per key
//! (id, minute start + 1 or 0, minute count, refused in window, day, day count, ban end,
//! last ban start + 1 or 0, ban level).

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::bans::BanPolicy;
use crate::keys::KeyId;
use crate::limits::{Decision, KeyState, Limiter, Standing};
use crate::plans::Limits;

/// File name of the snapshot inside the data directory.
pub const SNAPSHOT_FILE: &str = "limits.bin";
/// `ASLIMIT1` in ASCII: says what the file is and which layout it has.
const MAGIC: u64 = u64::from_le_bytes(*b"ASLIMIT1");
const WORDS_PER_KEY: usize = 9;
/// Which of a key's fields ([`KeyState::fields`]) may be absent: the minute window's start and
/// the last ban's. The file stores those one more than themselves, and absent as 0; the others
/// as they are.
const OPTIONAL: [bool; 8] = [true, false, false, false, false, false, true, false];

/// Why the snapshot could not be written.
#[derive(Debug, thiserror::Error)]
#[error("limiter snapshot {path}: {source}")]
pub struct SnapshotError {
    path: PathBuf,
    source: std::io::Error,
}

/// Limits in memory, persisted to the data directory.
pub struct EmbeddedStore {
    limiter: Limiter,
    path: PathBuf,
    dirty: AtomicBool,
    /// The ban rules the last request came with: what "idle" means for a snapshot.
    bans: std::sync::Mutex<BanPolicy>,
}

impl EmbeddedStore {
    /// Opens the store in `data_dir`, restoring the last snapshot. A damaged snapshot is moved
    /// aside (`limits.bin.damaged`) and logged, and the store starts empty: refusing to start
    /// would take the whole API down for the sake of some counters.
    pub fn open(data_dir: &Path, bans: BanPolicy) -> Result<EmbeddedStore, SnapshotError> {
        let path = data_dir.join(SNAPSHOT_FILE);
        let limiter = Limiter::new();
        match fs::read(&path) {
            Ok(bytes) => match decode(&bytes) {
                Some(states) => {
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
                    fs::rename(&path, &aside).map_err(|source| SnapshotError {
                        path: path.clone(),
                        source,
                    })?;
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(SnapshotError { path, source }),
        }
        Ok(EmbeddedStore {
            limiter,
            path,
            dirty: AtomicBool::new(false),
            bans: std::sync::Mutex::new(bans),
        })
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

    /// Writes a snapshot if anything changed since the last one.
    pub fn persist(&self, now_ms: u64) -> Result<(), SnapshotError> {
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let bans = *self.bans.lock().unwrap_or_else(|p| p.into_inner());
        let result = self.write(&encode(&self.limiter.snapshot(&bans, now_ms)));
        if result.is_err() {
            self.dirty.store(true, Ordering::Relaxed);
        }
        result
    }

    fn write(&self, bytes: &[u8]) -> Result<(), SnapshotError> {
        let err = |source| SnapshotError {
            path: self.path.clone(),
            source,
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(dir).map_err(err)?;
        let tmp = self.path.with_extension("bin.tmp");
        let mut file = File::create(&tmp).map_err(err)?;
        file.write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(err)?;
        fs::rename(&tmp, &self.path).map_err(err)?;
        File::open(dir).and_then(|d| d.sync_all()).map_err(err)
    }
}

fn encode(states: &[(KeyId, KeyState)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + states.len() * WORDS_PER_KEY * 8);
    let mut put = |word: u64| out.extend_from_slice(&word.to_le_bytes());
    put(MAGIC);
    put(states.len() as u64);
    for (id, s) in states {
        put(id.0);
        for (field, optional) in s.fields().into_iter().zip(OPTIONAL) {
            put(if optional {
                field.map_or(0, |v| v + 1)
            } else {
                field.unwrap_or(0)
            });
        }
    }
    out
}

fn decode(bytes: &[u8]) -> Option<Vec<(KeyId, KeyState)>> {
    let mut words = bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")));
    if !bytes.len().is_multiple_of(8) || words.next()? != MAGIC {
        return None;
    }
    let count = usize::try_from(words.next()?).ok()?;
    if bytes.len() != 16 + count.checked_mul(WORDS_PER_KEY * 8)? {
        return None;
    }
    let mut states = Vec::with_capacity(count);
    for _ in 0..count {
        let id = KeyId(words.next()?);
        let mut fields = [None; 8];
        for (field, optional) in fields.iter_mut().zip(OPTIONAL) {
            let word = words.next()?;
            *field = if optional {
                word.checked_sub(1)
            } else {
                Some(word)
            };
        }
        states.push((id, KeyState::from_fields(fields)));
    }
    Some(states)
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;

    use super::*;
    use crate::bans::BanState;
    use crate::limits::Verdict;

    const T0: u64 = 1_795_341_600_000;
    const LIMITS: Limits = Limits {
        per_minute: 3,
        per_day: 10,
    };

    #[test]
    fn a_snapshot_restores_counts_and_bans_and_forgets_idle_keys() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), BanPolicy::default()).unwrap();
        store.check(KeyId(1), LIMITS, &BanPolicy::default(), T0);
        store.check(KeyId(1), LIMITS, &BanPolicy::default(), T0 + 1);
        for _ in 0..3 {
            store.check(KeyId(2), LIMITS, &BanPolicy::default(), T0);
        }
        for _ in 0..11 {
            store.check(KeyId(2), LIMITS, &BanPolicy::default(), T0 + 2);
        }
        // Idle by the time of the snapshot: its minute is over and its day is past.
        store.check(KeyId(3), LIMITS, &BanPolicy::default(), T0 - 2 * 86_400_000);
        store.persist(T0 + 3).unwrap();

        let again = EmbeddedStore::open(dir.path(), BanPolicy::default()).unwrap();
        let d = again.check(KeyId(1), LIMITS, &BanPolicy::default(), T0 + 4);
        assert_eq!((d.verdict, d.quota.remaining), (Verdict::Admitted, 0));
        assert_eq!(
            again
                .check(KeyId(2), LIMITS, &BanPolicy::default(), T0 + 5)
                .verdict,
            Verdict::Banned
        );
        assert_eq!(
            again.limiter.snapshot(&BanPolicy::default(), T0 + 5).len(),
            2,
            "key 3 was idle"
        );
    }

    #[test]
    fn nothing_is_written_when_nothing_changed() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), BanPolicy::default()).unwrap();
        store.persist(T0).unwrap();
        assert!(!dir.path().join(SNAPSHOT_FILE).exists());
    }

    #[test]
    fn a_damaged_snapshot_is_moved_aside_and_the_store_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join(SNAPSHOT_FILE),
            b"ASLIMIT1\x05\0\0\0\0\0\0\0junk",
        )
        .unwrap();
        let store = EmbeddedStore::open(dir.path(), BanPolicy::default()).unwrap();
        assert!(dir.path().join("limits.bin.damaged").exists());
        let d = store.check(KeyId(1), LIMITS, &BanPolicy::default(), T0);
        assert_eq!(d.quota.remaining, 2);
    }

    #[test]
    fn encoding_round_trips() {
        let state = KeyState {
            minute_start_ms: NonZeroU64::new(1),
            minute_count: u32::MAX,
            day: 20_000,
            day_count: 1 << 40,
            ban: BanState {
                refused_in_window: 4,
                until_ms: 9,
                last_start_ms: None,
                level: 3,
            },
        };
        let states = vec![(KeyId(u64::MAX), state), (KeyId(0), KeyState::default())];
        assert_eq!(decode(&encode(&states)).unwrap(), states);
        assert!(decode(&encode(&states)[..20]).is_none());
    }

    /// The file format is pinned: a snapshot written before the state was packed reads the same.
    #[test]
    fn a_snapshot_in_the_first_format_reads_back() {
        let words: [u64; 11] = [MAGIC, 1, 7, T0 + 1, 5, 2, 20_781, 9, 0, T0 - 999 + 1, 1];
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let states = decode(&bytes).unwrap();
        assert_eq!(
            states,
            vec![(
                KeyId(7),
                KeyState {
                    minute_start_ms: NonZeroU64::new(T0),
                    minute_count: 5,
                    day: 20_781,
                    day_count: 9,
                    ban: BanState {
                        refused_in_window: 2,
                        until_ms: 0,
                        last_start_ms: NonZeroU64::new(T0 - 999),
                        level: 1,
                    },
                },
            )]
        );
        assert_eq!(encode(&states), bytes);
    }
}
