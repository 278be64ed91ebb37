//! Disk faults through the real binary, on a small tmpfs: a full disk gives 503 and loses or
//! corrupts nothing acknowledged, and the backend recovers by itself when space returns; a
//! read-only data directory at start is a clear error, not a panic.
//!
//! Mounting needs root, so these are ignored by a plain `cargo test`; `.ci/run` (root) runs them
//! with `cargo test --test disk_faults -- --ignored`.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Backend, client};
use serde_json::{Value, json};

/// A tmpfs of `size` mounted on a fresh directory; unmounted when dropped.
struct Tmpfs {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(options: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mnt");
        std::fs::create_dir(&path).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(&path)
            .status()
            .unwrap();
        assert!(
            status.success(),
            "mount -t tmpfs failed: these tests need root"
        );
        Tmpfs { path, _dir: dir }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Writes zeros to `path` until the file system is full.
fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).unwrap();
    let block = vec![0u8; 64 * 1024];
    while file.write_all(&block).is_ok() {}
    let _ = file.sync_all();
}

async fn create(c: &reqwest::Client, b: &Backend, name: &str) -> (u16, Value) {
    let r = c
        .post(b.url("/v1/pets"))
        .json(&json!({"name": name, "categoryId": 1}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root to mount a tmpfs; .ci/run runs it"]
async fn a_full_disk_gives_503_loses_nothing_and_recovers_when_space_returns() {
    let fs = Tmpfs::mount("size=4m");
    let data = fs.path.join("data");
    let b = Backend::start(&data);
    let c = client();
    let mut acknowledged = Vec::new();
    for i in 0..5 {
        let (status, pet) = create(&c, &b, &format!("before {i}")).await;
        assert_eq!(status, 201);
        acknowledged.push(pet);
    }

    fill(&fs.path.join("filler"));
    let long_name = "n".repeat(100);
    let mut refused = None;
    for _ in 0..20_000 {
        let (status, body) = create(&c, &b, &long_name).await;
        match status {
            201 => acknowledged.push(body),
            503 => {
                refused = Some(body);
                break;
            }
            other => panic!("a full disk must give 503, not {other}: {body}"),
        }
    }
    let refused = refused.expect("the disk filled up and a create was refused");
    assert_eq!(refused["code"], "unavailable");
    assert!(
        !refused["message"].as_str().unwrap().contains("/"),
        "no paths in the message: {refused}"
    );

    std::fs::remove_file(fs.path.join("filler")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, body) = create(&c, &b, "after").await;
        if status == 201 {
            acknowledged.push(body);
            break;
        }
        assert_eq!(status, 503, "{body}");
        assert!(
            Instant::now() < deadline,
            "no recovery within 15 s of space returning"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let (listed, _) = common::walk_pets(&c, &b.url(""), "/v1/pets?limit=100", None).await;
    for pet in &acknowledged {
        assert!(
            listed.contains(pet),
            "acknowledged pet {} survived",
            pet["id"]
        );
    }
    // And after a restart from disk, too.
    let mut b = b;
    assert_eq!(b.proc.terminate(), Some(0));
    drop(b);
    let b = Backend::start(&data);
    let (listed, _) = common::walk_pets(&c, &b.url(""), "/v1/pets?limit=100", None).await;
    for pet in &acknowledged {
        assert!(
            listed.contains(pet),
            "acknowledged pet {} survived the restart",
            pet["id"]
        );
    }
}

#[test]
#[ignore = "needs root to mount a tmpfs; .ci/run runs it"]
fn a_read_only_data_directory_is_a_clear_error_at_start() {
    let fs = Tmpfs::mount("size=1m,ro");
    let (code, _, stderr) = common::cli(&[
        "backend",
        "--config",
        common::shipped_config().to_str().unwrap(),
        "--data-dir",
        fs.path.join("data").to_str().unwrap(),
        "--backend-listen",
        &common::free_addr().to_string(),
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("data directory") && stderr.contains("Read-only file system"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
