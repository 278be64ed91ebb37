//! Tests of the sled trees: what a crash between writes leaves behind, flushes shared by concurrent
//! creates, one pet per idempotency key, and idempotency records expiring.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::*;
use crate::store::{CommitMode, Store};

fn pet(name: &str) -> NewPet {
    NewPet {
        name: name.to_owned(),
        category_id: 1,
        status: PetStatus::Available,
    }
}

fn key(k: &str) -> Option<IdempotencyKey> {
    Some(IdempotencyKey {
        scope: "k1".to_owned(),
        key: k.to_owned(),
    })
}

#[tokio::test]
async fn a_record_whose_pet_a_crash_lost_is_completed_by_the_retry() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), CommitMode::Group).unwrap();
    let now = 1_795_341_600;
    // What a crash between the record and the pet leaves behind.
    let trees = store.trees().unwrap();
    let lost = IdempotencyRecord {
        name: "a".to_owned(),
        category_id: 1,
        status: PetStatus::Available,
        pet_id: trees.next_id().unwrap(),
        created: now,
    };
    let storage_key = key("k").unwrap().storage_key();
    let bytes = serde_json::to_vec(&lost).unwrap();
    trees.idempotency.insert(storage_key, bytes).unwrap();
    assert_eq!(store.get(lost.pet_id).unwrap(), None);

    let retried = store.create(pet("a"), key("k"), now + 5).await.unwrap();
    assert_eq!(retried, Created::Replayed(lost.pet()));
    assert_eq!(store.get(lost.pet_id).unwrap(), Some(lost.pet()));
    let query = ListQuery {
        limit: 10,
        status: Some(PetStatus::Available),
        after: None,
    };
    assert_eq!(store.list(&query).unwrap(), (vec![lost.pet()], false));
    assert_eq!(
        store.create(pet("b"), key("k"), now + 6).await.unwrap(),
        Created::KeyReused
    );
}

#[tokio::test]
async fn index_entries_whose_pet_a_crash_lost_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), CommitMode::Group).unwrap();
    let now = 1_795_341_600;
    let mut kept = Vec::new();
    for name in ["a", "b", "c"] {
        let Created::New(p) = store.create(pet(name), None, now).await.unwrap() else {
            panic!()
        };
        kept.push(p);
        // An index entry written just before a crash, its pet never written.
        let trees = store.trees().unwrap();
        let orphan = trees.next_id().unwrap();
        trees
            .by_status
            .insert(status_key(PetStatus::Available, orphan), &[])
            .unwrap();
    }
    let page = |after, limit| {
        store
            .list(&ListQuery {
                status: Some(PetStatus::Available),
                after,
                limit,
            })
            .unwrap()
    };
    assert_eq!(page(None, 10), (kept.clone(), false));
    assert_eq!(page(None, 2), (kept[..2].to_vec(), true));
    // The last pet is followed only by an orphan: no further page is promised.
    assert_eq!(page(Some(kept[1].id), 1), (kept[2..].to_vec(), false));
}

/// 64 clients on one worker thread, each doing a little work between its creates (as a
/// connection reads its next request): the flushes are shared by many creates, not made
/// for the first few that wake the flusher.
#[test]
fn concurrent_creates_share_their_flushes() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), CommitMode::Group).unwrap();
        let (clients, creates) = (64, 20);
        let tasks: Vec<_> = (0..clients)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move {
                    for _ in 0..creates {
                        for _ in 0..3 {
                            tokio::task::yield_now().await;
                        }
                        store.create(pet("a"), None, 0).await.unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let flushes = store.shared.group_flushes.load(Ordering::Relaxed);
        let per_flush = (clients * creates) as f64 / flushes as f64;
        assert!(
            per_flush >= 16.0,
            "{per_flush:.1} creates per flush ({flushes} flushes)"
        );
    });
}

#[test]
fn concurrent_creates_with_one_key_make_one_pet() {
    let dir = tempfile::tempdir().unwrap();
    let trees = Arc::new(Trees::open(dir.path()).unwrap());
    let results: Vec<Created> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let trees = &trees;
                scope.spawn(move || trees.insert(pet("a"), key("same"), 1_795_341_600))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    });
    let pets: Vec<&Pet> = results
        .iter()
        .map(|c| match c {
            Created::New(p) | Created::Replayed(p) => p,
            Created::KeyReused => panic!("the same request is not a reused key"),
        })
        .collect();
    assert!(pets.iter().all(|p| *p == pets[0]));
    let new = results
        .iter()
        .filter(|c| matches!(c, Created::New(_)))
        .count();
    assert_eq!(new, 1);
    assert_eq!(trees.pets.len(), 1);
    assert_eq!(trees.by_status.len(), 1);
}

#[tokio::test]
async fn idempotency_records_expire_and_are_purged_after_24_hours() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), CommitMode::Group).unwrap();
    let t0 = 1_795_341_600;
    let Created::New(first) = store.create(pet("a"), key("old"), t0).await.unwrap() else {
        panic!()
    };
    store
        .create(pet("b"), key("new"), t0 + 20 * 3600)
        .await
        .unwrap();
    // Within 24 h a retry is a replay; the purge keeps both records.
    let later = t0 + IDEMPOTENCY_TTL_SECS - 1;
    assert_eq!(
        store.create(pet("a"), key("old"), later).await.unwrap(),
        Created::Replayed(first.clone())
    );
    assert_eq!(store.purge_expired_idempotency(later).unwrap(), 0);
    // At 24 h the first expires and is purged; the second stays.
    assert_eq!(
        store
            .purge_expired_idempotency(t0 + IDEMPOTENCY_TTL_SECS)
            .unwrap(),
        1
    );
    let Created::New(again) = store
        .create(pet("a"), key("old"), t0 + IDEMPOTENCY_TTL_SECS)
        .await
        .unwrap()
    else {
        panic!("an expired key creates a new pet")
    };
    assert!(again.id > first.id);
    assert!(matches!(
        store
            .create(pet("x"), key("new"), t0 + 21 * 3600)
            .await
            .unwrap(),
        Created::KeyReused
    ));
}
