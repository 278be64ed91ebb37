//! Durability through the real binary: SIGKILL the backend in the middle of a stream of
//! concurrent creates, restart it, and find every acknowledged pet, unchanged. Repeated over
//! several rounds on the same data directory, so recovery of a recovered database is covered too.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Backend, client};
use serde_json::{Value, json};

const ROUNDS: usize = 4;
const WRITERS: usize = 24;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_creates_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let c = client();
    let mut acknowledged: BTreeMap<i64, Value> = BTreeMap::new();
    let mut total_in_rounds = Vec::new();

    for round in 0..ROUNDS {
        let mut backend = Backend::start(&data);
        verify_all(&c, &backend, &acknowledged).await;

        let acked = Arc::new(Mutex::new(Vec::<Value>::new()));
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let (c, url, acked) = (c.clone(), backend.url("/v1/pets"), acked.clone());
            writers.push(tokio::spawn(async move {
                for seq in 0.. {
                    let body = json!({"name": format!("r{round} w{w} #{seq}"), "categoryId": 1 + w, "status": "pending"});
                    match c.post(&url).json(&body).send().await {
                        Ok(r) if r.status() == 201 => match r.json::<Value>().await {
                            Ok(pet) => acked.lock().unwrap().push(pet),
                            Err(_) => return, // killed while the body was on its way: not acknowledged
                        },
                        Ok(r) => panic!("unexpected status {}", r.status()),
                        Err(_) => return, // the process is gone
                    }
                }
            }));
        }
        // Let the stream run, then kill without warning while creates are in flight.
        tokio::time::sleep(Duration::from_millis(400 + 150 * round as u64)).await;
        backend.proc.kill9();
        for writer in writers {
            writer.await.unwrap();
        }
        let acked = std::mem::take(&mut *acked.lock().unwrap());
        assert!(
            !acked.is_empty(),
            "round {round} acknowledged nothing: {}",
            backend.proc.log_text()
        );
        total_in_rounds.push(acked.len());
        for pet in acked {
            let id = pet["id"].as_i64().unwrap();
            assert!(
                acknowledged.insert(id, pet).is_none(),
                "id {id} was handed out twice"
            );
        }
    }

    let backend = Backend::start(&data);
    verify_all(&c, &backend, &acknowledged).await;
    // New ids keep increasing past everything handed out before the crashes.
    let r = c
        .post(backend.url("/v1/pets"))
        .json(&json!({"name": "after", "categoryId": 1}))
        .send()
        .await
        .unwrap();
    let pet: Value = r.json().await.unwrap();
    assert!(pet["id"].as_i64().unwrap() > *acknowledged.keys().last().unwrap());
    println!(
        "durability: {} acknowledged creates checked after {ROUNDS} SIGKILLs (per round: {total_in_rounds:?})",
        acknowledged.len()
    );
}

/// Every acknowledged pet is there, unchanged, both by id and in the listing; no id repeats.
async fn verify_all(c: &reqwest::Client, backend: &Backend, acknowledged: &BTreeMap<i64, Value>) {
    for (id, pet) in acknowledged.iter().step_by(7) {
        let r = c
            .get(backend.url(&format!("/v1/pets/{id}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "acknowledged pet {id} is missing");
        assert_eq!(&r.json::<Value>().await.unwrap(), pet);
    }
    let (pets, _) = common::walk_pets(
        c,
        &backend.url(""),
        "/v1/pets?limit=100&status=pending",
        None,
    )
    .await;
    let mut listed = BTreeMap::new();
    for pet in pets {
        let id = pet["id"].as_i64().unwrap();
        assert!(listed.insert(id, pet).is_none(), "pet {id} listed twice");
    }
    for (id, pet) in acknowledged {
        assert_eq!(
            listed.get(id),
            Some(pet),
            "acknowledged pet {id} missing from the listing"
        );
    }
    let names: HashSet<&str> = listed
        .values()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), listed.len(), "no create was stored twice");
}
