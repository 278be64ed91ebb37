//! Keys from issue to revocation, the failed-authentication budget and the first-run key,
//! through the real binary. Starts refused for their configuration are `start_refusals.rs`'s.

mod common;

use std::time::{Duration, Instant};

use common::{Stack, assert_error, cli, client, key_id};

/// Polls until `path` answers `status` with `key`, for at most 2 s (the contract's bound).
async fn within_two_seconds(stack: &Stack, key: &str, status: u16) -> bool {
    let c = client();
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let r = stack.get(&c, "/v1/pets", key).await;
        if r.status() == status {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn keys_created_and_revoked_take_effect_in_a_running_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let (code, key, _) = stack.keys_cli(&["create", "--plan", "business", "--name", "late"]);
    assert_eq!(code, 0);
    let key = key.trim().to_owned();
    assert!(
        within_two_seconds(&stack, &key, 200).await,
        "a new key works within 2 s"
    );
    let r = stack.get(&client(), "/v1/pets", &key).await;
    assert_eq!(r.headers()["x-ratelimit-limit"], "1000");

    let (code, out, _) = stack.keys_cli(&["revoke", key_id(&key)]);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), format!("revoked key {}", key_id(&key)));
    assert!(
        within_two_seconds(&stack, &key, 401).await,
        "a revoked key is refused within 2 s"
    );

    // Revoking by the key itself works too, and never prints the key.
    let (_, second, _) = stack.keys_cli(&["create", "--plan", "free"]);
    let second = second.trim().to_owned();
    assert!(within_two_seconds(&stack, &second, 200).await);
    let (code, out, err) = stack.keys_cli(&["revoke", &second]);
    assert_eq!(code, 0);
    assert!(!out.contains(&second[20..]) && !err.contains(&second[20..]));
    assert!(within_two_seconds(&stack, &second, 401).await);
    let (code, _, err) = stack.keys_cli(&["revoke", "ffffffffffffffff"]);
    assert_ne!(code, 0);
    assert!(err.contains("no key"), "{err}");

    // Nothing the gateway logged contains a secret.
    let log = stack.proc.log_text();
    assert!(!log.contains(&key[20..]) && !log.contains(&second[20..]));
}

#[tokio::test]
async fn keys_list_shows_everything_but_the_key_and_the_store_holds_only_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = common::shipped_config();
    let args = |extra: &[&str]| {
        let mut all = vec!["keys"];
        all.extend_from_slice(extra);
        all.extend_from_slice(&[
            "--data-dir",
            data.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ]);
        all.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let run = |extra: &[&str]| {
        let a = args(extra);
        cli(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let (code, out, _) = run(&["create", "--plan", "free", "--name", "alice"]);
    assert_eq!(code, 0);
    let free = out.trim().to_owned();
    assert_eq!(out.lines().count(), 1, "the key alone on stdout");
    assert!(free.starts_with("as_") && free.len() >= 3 + 16 + 1 + 32);
    let (_, out, _) = run(&[
        "create",
        "--plan",
        "enterprise",
        "--per-minute",
        "5000",
        "--per-day",
        "2000000",
    ]);
    let enterprise = out.trim().to_owned();

    let (code, _, err) = run(&["create", "--plan", "enterprise"]);
    assert_ne!(code, 0);
    assert!(err.contains("--per-minute"), "{err}");
    let (code, _, err) = run(&["create", "--plan", "gold"]);
    assert_ne!(code, 0);
    assert!(err.contains("unknown plan"), "{err}");

    run(&["revoke", key_id(&free)]);
    let (code, list, _) = run(&["list"]);
    assert_eq!(code, 0);
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 2);
    assert!(
        lines[0].starts_with(key_id(&free))
            && lines[0].contains("name=alice")
            && lines[0].contains("plan=free")
    );
    assert!(lines[0].contains("per_minute=60") && lines[0].contains("per_day=1000"));
    assert!(!lines[0].contains("revoked=-"), "{}", lines[0]);
    assert!(
        lines[1].contains("plan=enterprise")
            && lines[1].contains("per_minute=5000")
            && lines[1].contains("revoked=-")
    );
    for key in [&free, &enterprise] {
        assert!(!list.contains(&key[20..]), "list never shows a key");
        let store = std::fs::read_to_string(data.join("keys.json")).unwrap();
        assert!(!store.contains(&key[20..]), "the store holds no key");
    }
}

/// A request with two `Authorization` headers is refused, even when one of them (or both) holds
/// a valid key: which one counts would be a guess, and a proxy in front may guess otherwise. It
/// spends the address's budget like any bad key.
#[tokio::test]
async fn two_authorization_headers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "pro"]);
    let other = stack.key(&["--plan", "pro"]);
    let c = client();
    for (first, second) in [(&key, &other), (&key, &key)] {
        let r = c
            .get(stack.url("/v1/pets"))
            .header("authorization", format!("Bearer {first}"))
            .header("authorization", format!("Bearer {second}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["ratelimit-policy"], "\"failed-auth\";q=60;w=60");
        let body = assert_error(r, 401, "unauthorized").await;
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("one Authorization header"),
            "{body}"
        );
    }
    let r = stack.get(&c, "/v1/pets", &key).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["x-ratelimit-remaining"],
        "299",
        "nothing counted before"
    );
}

#[tokio::test]
async fn bad_keys_spend_the_address_budget_then_get_429() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "pro"]);
    let c = client();
    for (i, auth) in (0..60).zip(
        ["", "Basic abc", "Bearer", "Bearer as_0123456789abcdef_00"]
            .iter()
            .cycle(),
    ) {
        let mut request = c.get(stack.url("/v1/pets"));
        if !auth.is_empty() {
            request = request.header("authorization", *auth);
        }
        let r = request.send().await.unwrap();
        assert_eq!(r.headers()["x-ratelimit-limit"], "60");
        assert_eq!(
            r.headers()["x-ratelimit-remaining"],
            (59 - i).to_string().as_str()
        );
        assert_eq!(r.headers()["ratelimit-policy"], "\"failed-auth\";q=60;w=60");
        assert_error(r, 401, "unauthorized").await;
    }
    let r = c
        .get(stack.url("/v1/pets"))
        .bearer_auth("nope")
        .send()
        .await
        .unwrap();
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry));
    assert_error(r, 429, "too_many_auth_failures").await;
    // A valid key from the same address is still served.
    let r = stack.get(&c, "/v1/pets", &key).await;
    assert_eq!(r.status(), 200);
    // The scheme name is case-insensitive.
    let r = c
        .get(stack.url("/v1/pets"))
        .header("authorization", format!("bEaReR {key}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn first_start_issues_a_free_key_with_a_working_curl_line() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut stack = Stack::launch(dir.path(), data.clone(), &common::shipped_config());
    let stdout = {
        use std::io::Read;
        let mut pipe = stack.proc.child.stdout.take().unwrap();
        let mut text = Vec::new();
        let mut chunk = [0u8; 1024];
        while !String::from_utf8_lossy(&text).contains("/v1/pets\n") {
            let n = pipe.read(&mut chunk).unwrap();
            assert!(
                n > 0,
                "stdout closed early: {}",
                String::from_utf8_lossy(&text)
            );
            text.extend_from_slice(&chunk[..n]);
        }
        String::from_utf8_lossy(&text).into_owned()
    };
    let key = stdout
        .split_whitespace()
        .find(|w| w.starts_with("as_"))
        .expect("a key is printed")
        .to_owned();
    assert!(
        stdout.contains(&format!(
            "curl -i -H 'Authorization: Bearer {key}' http://{}/v1/pets",
            stack.listen
        )),
        "{stdout}"
    );
    let r = stack.get(&client(), "/v1/pets", &key).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-ratelimit-limit"], "60", "a Free key");
    assert!(
        !stack.proc.log_text().contains(&key[20..]),
        "the key is not in the log"
    );
    assert_eq!(stack.proc.terminate(), Some(0));

    // The second start issues nothing.
    let mut again = Stack::launch(dir.path(), data, &common::shipped_config());
    assert_eq!(again.proc.terminate(), Some(0));
    let mut rest = String::new();
    use std::io::Read;
    again
        .proc
        .child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut rest)
        .unwrap();
    assert!(!rest.contains("as_"), "{rest}");
}

/// A token that is not a key is told apart by its form: a real key with whitespace inside it is
/// malformed, and one with a digit changed is unknown; the gateway refuses each with its own
/// message and counts it under its reason, and the real key still passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_token_and_an_unknown_key_are_answered_apart() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "pro"]);
    let c = client();
    let split = format!("Bearer {} {}", &key[..20], &key[20..]);
    let last = if key.ends_with('0') { '1' } else { '0' };
    let changed = format!("Bearer {}{last}", &key[..key.len() - 1]);
    for (authorization, says) in [
        (split, "must be `Bearer <key>`"),
        (changed, "not valid or has been revoked"),
    ] {
        let r = c
            .get(stack.url("/v1/pets"))
            .header("authorization", authorization)
            .send()
            .await
            .unwrap();
        let body = assert_error(r, 401, "unauthorized").await;
        let message = body["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
    for reason in ["malformed", "unknown_key"] {
        let name = format!(r#"gateway_auth_failures_total{{reason="{reason}"}}"#);
        assert_eq!(common::metric(stack.admin, &name), Some(1.0), "{name}");
    }
    assert_eq!(stack.get(&c, "/v1/pets", &key).await.status(), 200);
}
