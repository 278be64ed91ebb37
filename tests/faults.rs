//! Faults and abuse through the real binary: SIGTERM under load, and a flood of distinct bad keys.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Stack, client};
use serde_json::{Value, json};

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_under_load_completes_in_flight_requests_and_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut stack = Stack::start(dir.path());
    let key = stack.enterprise_key(1000000, 10000000);
    let c = client();
    let acknowledged = Arc::new(Mutex::new(Vec::<Value>::new()));
    let unexpected = Arc::new(Mutex::new(Vec::<u16>::new()));
    let writers: Vec<_> = (0..16)
        .map(|w| {
            let (c, url, key) = (c.clone(), stack.url("/v1/pets"), key.clone());
            let (acknowledged, unexpected) = (acknowledged.clone(), unexpected.clone());
            tokio::spawn(async move {
                for seq in 0.. {
                    let body = json!({"name": format!("w{w} #{seq}"), "categoryId": 1 + w});
                    match c.post(&url).bearer_auth(&key).json(&body).send().await {
                        Ok(r) if r.status() == 201 => match r.json::<Value>().await {
                            Ok(pet) => acknowledged.lock().unwrap().push(pet),
                            Err(_) => return,
                        },
                        // Shutting down may refuse politely; anything else is a fault.
                        Ok(r) if r.status() == 503 => {}
                        Ok(r) => unexpected.lock().unwrap().push(r.status().as_u16()),
                        Err(_) => return, // the listener is closed: stop
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let before = acknowledged.lock().unwrap().len();
    let exit = tokio::task::spawn_blocking(move || {
        let code = stack.proc.terminate();
        (code, stack)
    })
    .await
    .unwrap();
    let (code, stack) = exit;
    assert_eq!(
        code,
        Some(0),
        "serve exits 0 on SIGTERM: {}",
        stack.proc.log_text()
    );
    for writer in writers {
        writer.await.unwrap();
    }
    assert_eq!(
        *unexpected.lock().unwrap(),
        Vec::<u16>::new(),
        "no request failed with another status"
    );
    let acknowledged: BTreeMap<i64, Value> = acknowledged
        .lock()
        .unwrap()
        .drain(..)
        .map(|p| (p["id"].as_i64().unwrap(), p))
        .collect();
    assert!(
        acknowledged.len() > before && before > 0,
        "writes were in flight when the signal came"
    );

    let data = stack.data_dir.clone();
    let config = stack.config.clone();
    drop(stack);
    let stack = Stack::launch(dir.path(), data, &config);
    stack.wait_keys_loaded();
    let (pets, _) = common::walk_pets(&c, &stack.url(""), "/v1/pets?limit=100", Some(&key)).await;
    let listed: BTreeMap<i64, Value> = pets
        .into_iter()
        .map(|p| (p["id"].as_i64().unwrap(), p))
        .collect();
    for (id, pet) in &acknowledged {
        assert_eq!(
            listed.get(id),
            Some(pet),
            "acknowledged pet {id} survived the shutdown"
        );
    }
    println!(
        "sigterm under load: {} acknowledged creates, all present after restart",
        acknowledged.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_distinct_bad_keys_leaves_memory_flat() {
    const REQUESTS: usize = 100_000;
    const CLIENTS: usize = 16;
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let pid = stack.proc.child.id();
    let c = client();
    let flood = |count: usize, offset: usize| {
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|t| {
                let (c, url) = (c.clone(), stack.url("/v1/pets"));
                tokio::spawn(async move {
                    for i in (t..count).step_by(CLIENTS) {
                        // A well-formed key that does not exist, different every time.
                        let key = format!(
                            "as_{:016x}_{:064x}",
                            offset + i,
                            (offset + i) as u128 * 7919
                        );
                        let r = c.get(&url).bearer_auth(key).send().await.unwrap();
                        assert!(
                            r.status() == 401 || r.status() == 429,
                            "status {}",
                            r.status()
                        );
                    }
                })
            })
            .collect();
        async move {
            for task in tasks {
                task.await.unwrap();
            }
        }
    };
    flood(10_000, 0).await; // warm up allocator pools and connections
    let warm = rss_kib(pid);
    flood(REQUESTS, 10_000).await;
    let after = rss_kib(pid);
    println!(
        "bad-key flood: RSS {warm} KiB after 10,000 requests, {after} KiB after {REQUESTS} more"
    );
    assert!(
        after <= warm + 8 * 1024,
        "memory grew from {warm} KiB to {after} KiB"
    );
    // The gateway still serves real keys.
    let key = stack.key(&["--plan", "pro"]);
    assert_eq!(stack.get(&c, "/v1/pets", &key).await.status(), 200);
}
