//! Keys over their life, in a running gateway: expiry, rotation with an overlap during which
//! both keys work and share one set of counters, `keys list` with last use and successor, and
//! `--json` for scripts. All through the real binary.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Stack, assert_error, client, key_id};
use serde_json::Value;

/// Polls until `key` gets `status` from the gateway, for up to `within`.
async fn wait_status(stack: &Stack, key: &str, status: u16, within: Duration) {
    let c = client();
    let deadline = Instant::now() + within;
    loop {
        let got = stack.get(&c, "/v1/rate_limit", key).await.status().as_u16();
        if got == status {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still {got}, not {status}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn list_json(stack: &Stack) -> Vec<Value> {
    let (code, out, err) = stack.keys_cli(&["list", "--json"]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).expect("keys list --json is one JSON array")
}

#[tokio::test]
async fn keys_expire_and_rotate_with_an_overlap_that_shares_counters() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let c = client();

    // A key that expires in 2 s works, then gets 401 with its own message.
    let short = stack.key(&["--plan", "free", "--expires-in", "2s"]);
    assert_eq!(stack.get(&c, "/v1/pets", &short).await.status(), 200);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let r = stack.get(&c, "/v1/pets", &short).await;
    let body = assert_error(r, 401, "unauthorized").await;
    assert!(
        body["message"].as_str().unwrap().contains("expired"),
        "{body}"
    );
    let listed = list_json(&stack);
    let entry = listed.iter().find(|k| k["id"] == key_id(&short)).unwrap();
    assert!(entry["expires"].as_str().unwrap().ends_with('Z'));

    // Rotation: the successor shares the old key's counters; during the overlap both work.
    let old = stack.enterprise_key(10, 1000);
    for _ in 0..4 {
        assert_eq!(stack.get(&c, "/v1/pets", &old).await.status(), 200);
    }
    let (code, new, err) = stack.keys_cli(&["rotate", key_id(&old), "--overlap", "3s"]);
    assert_eq!(code, 0, "{err}");
    let new = new.trim().to_owned();
    assert_eq!(new.lines().count(), 1, "the new key alone on stdout");
    wait_status(&stack, &new, 200, Duration::from_secs(5)).await;
    let r = stack.get(&c, "/v1/pets", &new).await;
    assert_eq!(
        r.headers()["x-ratelimit-remaining"],
        "5",
        "the 4 requests of the old key count"
    );
    let r = stack.get(&c, "/v1/pets", &old).await;
    assert_eq!(r.status(), 200, "the old key works during the overlap");
    assert_eq!(
        r.headers()["x-ratelimit-remaining"],
        "4",
        "one set of counters for both"
    );
    let (_, standing) = {
        let r = stack.get(&c, "/v1/rate_limit", &new).await;
        (r.status(), r.json::<Value>().await.unwrap())
    };
    assert_eq!(standing["key_id"], key_id(&new));
    assert_eq!(standing["minute"]["remaining"], 4);
    // After the overlap the old key stops; the new one goes on, counts intact.
    wait_status(&stack, &old, 401, Duration::from_secs(6)).await;
    let r = stack.get(&c, "/v1/pets", &new).await;
    assert_eq!(r.headers()["x-ratelimit-remaining"], "3");

    let listed = list_json(&stack);
    let old_entry = listed.iter().find(|k| k["id"] == key_id(&old)).unwrap();
    let new_entry = listed.iter().find(|k| k["id"] == key_id(&new)).unwrap();
    assert_eq!(old_entry["successor"], key_id(&new));
    assert_eq!(new_entry["plan"], "enterprise");
    assert_eq!(
        (
            new_entry["per_minute"].as_u64(),
            new_entry["per_day"].as_u64()
        ),
        (Some(10), Some(1000))
    );
    let text = serde_json::to_string(&listed).unwrap();
    assert!(
        !text.contains(&new[20..]) && !text.contains(&old[20..]),
        "never the key"
    );
    // Rotating a key that was already rotated is refused with a pointer to its successor.
    let (code, _, err) = stack.keys_cli(&["rotate", key_id(&new), "--overlap", "1h"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = stack.keys_cli(&["rotate", key_id(&new)]);
    assert_ne!(code, 0);
    assert!(err.contains("already rotated"), "{err}");
}

#[tokio::test]
async fn keys_list_shows_the_last_use_to_the_minute_written_without_a_write_per_request() {
    let dir = tempfile::tempdir().unwrap();
    let mut stack = Stack::start(dir.path());
    let c = client();
    let used = stack.key(&["--plan", "pro"]);
    let idle = stack.key(&["--plan", "pro"]);
    for _ in 0..3 {
        assert_eq!(stack.get(&c, "/v1/pets", &used).await.status(), 200);
    }
    // Written once a minute and at shutdown, never per request.
    assert_eq!(stack.proc.terminate(), Some(0));
    let (code, out, _) = stack.keys_cli(&["list"]);
    assert_eq!(code, 0);
    let line = |key: &str| {
        out.lines()
            .find(|l| l.starts_with(key_id(key)))
            .unwrap()
            .to_owned()
    };
    let used_line = line(&used);
    let minute = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + Duration::from_secs(common::unix_now() / 60 * 60),
    )
    .to_string();
    assert!(
        used_line.contains(&format!("last_used={minute}")) || used_line.contains("last_used=20"),
        "{used_line}"
    );
    assert!(line(&idle).contains("last_used=-"), "{}", line(&idle));
    for field in ["expires=-", "revoked=-", "successor=-", "per_minute=300"] {
        assert!(used_line.contains(field), "{field} in {used_line}");
    }
}

/// Runs `animal-store keys ARGS` against the stack with `stdout` as its standard output;
/// returns (exit code, stderr).
fn keys_into(stack: &Stack, stdout: impl Into<Stdio>, args: &[&str]) -> (i32, String) {
    let out = Command::new(common::BIN)
        .arg("keys")
        .args(args)
        .args(["--config", stack.config.to_str().unwrap()])
        .args(["--data-dir", stack.data_dir.to_str().unwrap()])
        .env_remove(common::REDIS_URL_ENV)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .output()
        .expect("run animal-store keys");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    (out.status.code().unwrap_or(-1), stderr)
}

fn dev_full() -> std::fs::File {
    std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap()
}

#[tokio::test]
async fn a_key_that_cannot_be_printed_is_revoked_and_a_reader_gone_is_no_error() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // The first start's key, with stdout full: revoked, and the start goes on.
    let shipped = common::shipped_config();
    let stack = Stack::launch_after(Some("exec >/dev/full"), dir.path(), data, &shipped, &[]);
    let log = stack.proc.log_text();
    assert!(
        log.contains("could not be written to standard output")
            && log.contains("so it was revoked; issue one with `animal-store keys create"),
        "{log}"
    );
    let listed = list_json(&stack);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["name"], "first-run");
    assert!(listed[0]["revoked"].is_string(), "{listed:?}");

    // `keys create` into a full stdout: exit 1, and the key, shown to no one, is revoked.
    let (code, err) = keys_into(&stack, dev_full(), &["create", "--plan", "free"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("so it was revoked"), "{err}");
    let listed = list_json(&stack);
    assert_eq!(listed.len(), 2);
    assert!(
        listed.iter().all(|k| k["revoked"].is_string()),
        "{listed:?}"
    );

    // A rotation whose successor could not be printed can be made again.
    let old = stack.enterprise_key(10, 1000);
    let (code, err) = keys_into(&stack, dev_full(), &["rotate", key_id(&old)]);
    assert_eq!(code, 1, "{err}");
    let (code, new, err) = stack.keys_cli(&["rotate", key_id(&old)]);
    assert_eq!(code, 0, "{err}");
    wait_status(&stack, new.trim(), 200, Duration::from_secs(5)).await;
    wait_status(&stack, &old, 200, Duration::from_secs(5)).await;

    // `keys list | head -0`: the reader has gone before the list is written. No panic, exit 0.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let (code, err) = keys_into(&stack, writer, &["list"]);
    assert_eq!(code, 0, "{err}");
}

/// `keys create` and `keys rotate` refuse what `keys list` could not show, and store nothing:
/// a name that is empty, over 100 characters or with control characters (a tab or a newline
/// would split its row, an escape would reach the terminal), a lifetime under a second or past
/// 100 years (RFC 3339 ends at year 9999; such a key once made `keys list` panic, for good).
#[test]
fn names_and_lifetimes_that_keys_list_cannot_show_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::shipped_config();
    let data = dir.path().join("data");
    let keys = |args: &[&str]| {
        let global = [
            "--config",
            config.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
        ];
        let (code, out, err) = common::cli(&[&["keys"], args, &global].concat());
        assert!(!err.contains("panicked"), "{err}");
        (code, out, err)
    };
    let long = "x".repeat(101);
    let refused: [(&[&str], &str); 7] = [
        (&["--name", "a\tb"], "--name must be 1 to 100 characters"),
        (&["--name", "line\nbreak"], "--name must be"),
        (&["--name", "\x1b[31mred"], "--name must be"),
        (&["--name", ""], "--name must be"),
        (&["--name", &long], "--name must be"),
        (
            &["--expires-in", "0s"],
            "--expires-in must be from 1s to 36500d",
        ),
        (
            &["--expires-in", "99999999999d"],
            "--expires-in must be from 1s to 36500d (100 years), not 99999999999d",
        ),
    ];
    for (args, why) in refused {
        let (code, out, err) = keys(&[&["create", "--plan", "free"], args].concat());
        assert_eq!((code, out.as_str()), (1, ""), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
    }
    let (code, out, err) = keys(&["list"]);
    assert_eq!((code, out.as_str()), (0, ""), "nothing stored: {err}");

    // The longest of each is fine, and lists as a date.
    let name = format!("Bob's app, café {}", "x".repeat(84));
    let (code, key, err) = keys(&[
        "create",
        "--plan",
        "free",
        "--name",
        &name,
        "--expires-in",
        "36500d",
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = keys(&["list"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("\tname={name}\t")), "{out}");
    assert!(out.contains("\texpires=21"), "{out}");

    // A rotation's overlap has the same bound; the old key is left as it was.
    let (code, out, err) = keys(&["rotate", key_id(key.trim()), "--overlap", "99999999999d"]);
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(
        err.contains("--overlap must be from 0s to 36500d (100 years), not 99999999999d"),
        "{err}"
    );
    let (_, out, _) = keys(&["list"]);
    assert!(out.contains("\tsuccessor=-"), "{out}");
}
