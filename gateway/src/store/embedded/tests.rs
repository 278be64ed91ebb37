//! Unit tests of [`super`] (`embedded.rs`).

use super::*;
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
    let mut kept = 0;
    again
        .limiter
        .snapshot(&BanPolicy::default(), T0 + 5, |_, _| kept += 1);
    assert_eq!(kept, 2, "key 3 was idle");
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

const WIDE: Limits = Limits {
    per_minute: 100,
    per_day: 1000,
};

fn requests(store: &EmbeddedStore, key: u64, n: usize, at: u64) {
    for _ in 0..n {
        store.check(KeyId(key), WIDE, &BanPolicy::default(), at);
    }
}

fn remaining(store: &EmbeddedStore, key: u64) -> u64 {
    store.peek(KeyId(key), WIDE, T0 + 10).minute.remaining
}

fn file_len(dir: &Path, name: &str) -> u64 {
    fs::metadata(dir.join(name)).unwrap().len()
}

#[test]
fn a_second_writes_only_the_keys_that_changed_and_they_replay() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), BanPolicy::default()).unwrap();
    for key in 1..=100 {
        requests(&store, key, 1, T0);
    }
    store.persist(T0).unwrap();
    assert_eq!(file_len(dir.path(), SNAPSHOT_FILE), 24 + 100 * 72);
    assert_eq!(file_len(dir.path(), JOURNAL_FILE), 16);

    requests(&store, 5, 2, T0 + 1);
    store.persist(T0 + 1).unwrap();
    // One batch of one key: its count, its nine words, its checksum.
    assert_eq!(file_len(dir.path(), JOURNAL_FILE), 16 + 8 + 72 + 8);
    assert_eq!(file_len(dir.path(), SNAPSHOT_FILE), 24 + 100 * 72);
    requests(&store, 5, 1, T0 + 2);
    requests(&store, 6, 1, T0 + 2);
    store.persist(T0 + 2).unwrap();
    assert_eq!(file_len(dir.path(), JOURNAL_FILE), 16 + 88 + 8 + 2 * 72 + 8);
    drop(store);

    let again = EmbeddedStore::open(dir.path(), BanPolicy::default()).unwrap();
    assert_eq!(remaining(&again, 5), 96);
    assert_eq!(remaining(&again, 6), 98);
    assert_eq!(remaining(&again, 7), 99);
}

#[test]
fn changes_taken_by_a_failed_write_are_written_by_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = EmbeddedStore::open(&data, BanPolicy::default()).unwrap();
    requests(&store, 1, 3, T0);
    // A file where the data directory should be: the write fails.
    fs::write(&data, b"in the way").unwrap();
    assert!(store.persist(T0).is_err());
    fs::remove_file(&data).unwrap();
    store.persist(T0 + 1).unwrap();
    drop(store);
    let again = EmbeddedStore::open(&data, BanPolicy::default()).unwrap();
    assert_eq!(remaining(&again, 1), 97);
}

/// A process over `dir` that counts one request of key 1 and writes, in each of `seconds`.
fn one_request_a_second(dir: &Path, seconds: std::ops::Range<u64>) {
    let store = EmbeddedStore::open(dir, BanPolicy::default()).unwrap();
    for second in seconds {
        requests(&store, 1, 1, T0 + second);
        store.persist(T0 + second).unwrap();
    }
}

#[test]
fn a_batch_cut_short_by_a_crash_is_where_replay_stops() {
    let dir = tempfile::tempdir().unwrap();
    one_request_a_second(dir.path(), 0..3);
    let journal = dir.path().join(JOURNAL_FILE);
    let whole = fs::read(&journal).unwrap();
    // Key 1's remaining requests after a restart over `bytes` as the journal.
    let replayed = |bytes: &[u8]| {
        fs::write(&journal, bytes).unwrap();
        remaining(
            &EmbeddedStore::open(dir.path(), BanPolicy::default()).unwrap(),
            1,
        )
    };
    assert_eq!(
        replayed(&whole[..whole.len() - 5]),
        98,
        "the second request, not the third"
    );
    // A batch of the right length with a damaged word fails its checksum.
    let mut bad = whole.clone();
    bad[whole.len() - 20] ^= 1;
    assert_eq!(
        replayed(&bad),
        98,
        "the second request, not the damaged third"
    );
    // A damaged count word is no better than a short batch.
    let mut bad = whole.clone();
    bad[16] ^= 0xff;
    assert_eq!(replayed(&bad), 99, "the snapshot's");
}

#[test]
fn a_journal_of_an_older_snapshot_is_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    one_request_a_second(dir.path(), 0..2);
    let journal = dir.path().join(JOURNAL_FILE);
    let old = fs::read(&journal).unwrap();

    // The next process compacts on its first write: key 1 at 3 requests, generation 2.
    one_request_a_second(dir.path(), 2..3);
    // A crash after the new snapshot and before the new journal leaves the old journal,
    // whose key 1 has 2 requests.
    fs::write(&journal, &old).unwrap();
    let again = EmbeddedStore::open(dir.path(), BanPolicy::default()).unwrap();
    assert_eq!(remaining(&again, 1), 97);
}

#[test]
fn a_journal_grown_past_the_snapshot_is_compacted_into_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), BanPolicy::default()).unwrap();
    // Enough keys that one batch of all of them is over the compaction floor.
    let keys = MIN_COMPACTION_BYTES / 72 + 1;
    for key in 1..=keys {
        requests(&store, key, 1, T0);
    }
    store.persist(T0).unwrap();
    let generation = |dir: &Path| {
        decode(&fs::read(dir.join(SNAPSHOT_FILE)).unwrap())
            .unwrap()
            .0
    };
    let first = generation(dir.path());
    for key in 1..=keys {
        requests(&store, key, 1, T0 + 1);
    }
    store.persist(T0 + 1).unwrap();
    assert_eq!(generation(dir.path()), first + 1);
    assert_eq!(file_len(dir.path(), JOURNAL_FILE), 16);
    drop(store);
    let again = EmbeddedStore::open(dir.path(), BanPolicy::default()).unwrap();
    assert_eq!(remaining(&again, 1), 98);
    assert_eq!(remaining(&again, keys), 98);
}
