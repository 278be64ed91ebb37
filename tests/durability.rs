//! Durability through the real binary: SIGKILL the backend in the middle of a stream of
//! concurrent creates, restart it, and find every acknowledged pet, unchanged. Repeated over
//! several rounds on the same data directory, so recovery of a recovered database is covered too.
//! Every create carries an idempotency key; the creates a kill interrupted are retried with
//! theirs after the restart, as a client would, and each must yield exactly one pet.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Backend, client};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

const ROUNDS: usize = 4;
const WRITERS: usize = 24;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_creates_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let c = client();
    let mut acknowledged: BTreeMap<i64, Value> = BTreeMap::new();
    let mut interrupted = Vec::new();
    let mut replays = 0;
    let mut total_in_rounds = Vec::new();

    for round in 0..ROUNDS {
        let mut backend = Backend::start(&data);
        verify_all(&c, &backend, &acknowledged).await;
        replays += retry_interrupted(
            &c,
            &backend,
            std::mem::take(&mut interrupted),
            &mut acknowledged,
        )
        .await;

        let acked = Arc::new(Mutex::new(Vec::<Value>::new()));
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let (c, url, acked) = (c.clone(), backend.url("/v1/pets"), acked.clone());
            writers.push(tokio::spawn(async move {
                for seq in 0.. {
                    let key = format!("r{round}-w{w}-{seq}");
                    let body = json!({"name": format!("r{round} w{w} #{seq}"), "categoryId": 1 + w, "status": "pending"});
                    let sent = c.post(&url).header("Idempotency-Key", &key).json(&body).send();
                    match sent.await {
                        Ok(r) if r.status() == 201 => match r.json::<Value>().await {
                            Ok(pet) => acked.lock().unwrap().push(pet),
                            // Killed while the body was on its way: not acknowledged.
                            Err(_) => return (key, body),
                        },
                        Ok(r) => panic!("unexpected status {}", r.status()),
                        Err(_) => return (key, body), // the process is gone
                    }
                }
                unreachable!()
            }));
        }
        // Let the stream run, then kill without warning while creates are in flight.
        tokio::time::sleep(Duration::from_millis(400 + 150 * round as u64)).await;
        backend.proc.kill9();
        for writer in writers {
            interrupted.push(writer.await.unwrap());
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
    replays += retry_interrupted(&c, &backend, interrupted, &mut acknowledged).await;
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
        "durability: {} acknowledged creates checked after {ROUNDS} SIGKILLs (per round: \
         {total_in_rounds:?}); of {} interrupted creates retried, {replays} had been stored",
        acknowledged.len(),
        ROUNDS * WRITERS
    );
}

/// Retries each create a kill interrupted, with its idempotency key: whether the crash kept all,
/// part or none of it, the retry answers 201 with one pet of that name (checked for duplicates by
/// `verify_all`).
async fn retry_interrupted(
    c: &reqwest::Client,
    backend: &Backend,
    interrupted: Vec<(String, Value)>,
    acknowledged: &mut BTreeMap<i64, Value>,
) -> usize {
    let mut replayed = 0;
    for (key, body) in interrupted {
        let r = c
            .post(backend.url("/v1/pets"))
            .header("Idempotency-Key", &key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "retry of {key}");
        replayed += usize::from(r.headers().contains_key("idempotent-replayed"));
        let pet: Value = r.json().await.unwrap();
        assert_eq!(pet["name"], body["name"], "retry of {key}");
        let id = pet["id"].as_i64().unwrap();
        assert!(
            acknowledged.insert(id, pet).is_none(),
            "the retry of {key} returned the acknowledged pet {id}"
        );
    }
    replayed
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
    // Every pet is pending: the filtered listing (the status index) and the full one (the
    // records) must agree, whatever the kills interrupted.
    let (all, _) = common::walk_pets(c, &backend.url(""), "/v1/pets?limit=100", None).await;
    let all: BTreeMap<i64, Value> = all
        .into_iter()
        .map(|p| (p["id"].as_i64().unwrap(), p))
        .collect();
    assert_eq!(all, listed, "the status index and the records disagree");
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

/// What the disk is asked for: sled's `flush` waits for its log with `sync_file_range` on Linux,
/// which leaves the disk's volatile write cache alone, so a `201` must also wait for an
/// `fdatasync` (or `fsync`) of the log. The backend runs under `strace`, which stamps each such
/// call; every create, one at a time, must have had one of the log start after it was sent and
/// return before its `201` came back. With sled's flush alone, only its own `fsync` every
/// 500 ms would be seen, by no more than one of the creates. sled syncs no directory: the
/// store's fsync of the new database's is looked for as well.
#[tokio::test]
async fn every_create_waits_for_the_disk_to_sync_the_log() {
    const CREATES: usize = 20;
    let strace = std::process::Command::new("strace").arg("-V").output();
    assert!(
        strace.is_ok_and(|out| out.status.success()),
        "strace is needed for this test: apt-get install -y strace"
    );
    for mode in ["group", "per_request"] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let config = dir.path().join("backend.toml");
        std::fs::write(&config, format!("[backend]\ncommit = \"{mode}\"\n")).unwrap();
        let trace = dir.path().join("strace.out");
        let wrapper = [
            "strace",
            "-f",
            "-y",
            "-ttt",
            "-T",
            "-e",
            "trace=fsync,fdatasync",
            "-o",
            trace.to_str().unwrap(),
            "--",
        ];
        let mut backend = Backend::start_under(&wrapper, &data, &config);
        // strace passes no signal on and leaves its child running when it is killed itself, so
        // the backend, its child, is stopped on its own, also when an assertion fails.
        let children = format!("/proc/{0}/task/{0}/children", backend.proc.pid());
        let pid: i32 = std::fs::read_to_string(&children)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let traced = KillOnDrop(Pid::from_raw(pid));
        let c = client();
        let mut creates = Vec::new();
        for n in 0..CREATES {
            let sent = unix_seconds();
            let r = c
                .post(backend.url("/v1/pets"))
                .json(&json!({"name": format!("synced #{n}"), "categoryId": 1}))
                .send()
                .await
                .unwrap();
            let answered = unix_seconds();
            assert_eq!(r.status(), 201, "{mode}: create #{n}");
            creates.push((sent, answered));
        }
        kill(traced.0, Signal::SIGTERM).unwrap();
        backend
            .proc
            .wait_exit("SIGTERM to the backend under strace");
        // strace has ended, so has the backend: its id may be another process's now.
        std::mem::forget(traced);

        let trace = std::fs::read_to_string(&trace).unwrap();
        // The database is new: the names of its files are synced too, once, at open.
        let directory = data.join("pets.sled");
        assert!(
            !log_syncs(&trace, &directory).is_empty(),
            "{mode}: no fsync of {}",
            directory.display()
        );
        let log = directory.join("db");
        let syncs = log_syncs(&trace, &log);
        for (n, (sent, answered)) in creates.iter().enumerate() {
            assert!(
                syncs
                    .iter()
                    .any(|(start, end)| start >= sent && end <= answered),
                "{mode}: create #{n} (sent at {sent:.6}, answered at {answered:.6}) had no \
                 fdatasync or fsync of {} between; the log's syncs (start, end): {syncs:?}",
                log.display()
            );
        }
    }
}

/// SIGKILL for a process when the test leaves without stopping it.
struct KillOnDrop(Pid);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGKILL);
    }
}

fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The successful `fsync` and `fdatasync` calls on `file` in the output of `strace -f -y -ttt
/// -T`, as (start, end) in Unix seconds. A call during which another thread made one is split
/// in two lines of its thread, `<unfinished ...>` and `<... fdatasync resumed>`.
fn log_syncs(strace: &str, file: &Path) -> Vec<(f64, f64)> {
    let on_file = format!("<{}>", file.display());
    let mut unfinished = std::collections::HashMap::new();
    let mut syncs = Vec::new();
    for line in strace.lines() {
        // `1744  1795919233.249893 fsync(...`: the thread (padded), the time, the call.
        let Some((thread, rest)) = line.split_once(' ') else {
            continue;
        };
        let Some((stamp, call)) = rest.trim_start().split_once(' ') else {
            continue;
        };
        let Ok(stamp) = stamp.parse::<f64>() else {
            continue;
        };
        let (start, call) = if call.starts_with("<... ") {
            match unfinished.remove(thread) {
                Some(start) => (start, call),
                None => continue,
            }
        } else if !(call.starts_with("fsync(") || call.starts_with("fdatasync("))
            || !call.contains(&on_file)
        {
            continue;
        } else if call.ends_with("<unfinished ...>") {
            unfinished.insert(thread.to_owned(), stamp);
            continue;
        } else {
            (stamp, call)
        };
        // `... = 0 <0.000345>`: succeeded, and how long it took.
        let Some((result, took)) = call.rsplit_once(" <") else {
            continue;
        };
        let took = took.trim_end_matches('>').parse::<f64>();
        if let (true, Ok(took)) = (result.ends_with(") = 0"), took) {
            syncs.push((start, start + took));
        }
    }
    syncs
}
