//! What a platform team reads: `/metrics` with exact counts after known traffic, the access
//! log as one JSON object per line, and a `debug` log with no key in it, through the real
//! binary.

mod common;

use std::time::Duration;

use common::{PETS_ROUTE, Stack, client, key_id, metric};
use serde_json::Value;

#[tokio::test]
async fn metrics_count_known_traffic_exactly_with_bounded_labels() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let pro = stack.key(&["--plan", "pro"]);
    let one = stack.enterprise_key(1, 1000);
    let c = client();
    for _ in 0..3 {
        assert_eq!(stack.get(&c, "/v1/pets", &pro).await.status(), 200);
    }
    let created = c
        .post(stack.url("/v1/pets"))
        .bearer_auth(&pro)
        .json(&serde_json::json!({"name": "Rex", "categoryId": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    c.get(stack.url("/v1/pets")).send().await.unwrap(); // no key
    stack.get(&c, "/v1/pets", "as_0000000000000000_nope").await; // unknown key
    stack.get(&c, "/v1/nothing/here", &pro).await; // no route
    stack.get(&c, "/v1/rate_limit", &pro).await;
    c.get(stack.url("/v1/docs")).send().await.unwrap();
    // One admitted, ten refused for the minute, the eleventh imposes a ban, one more while banned.
    for _ in 0..13 {
        stack.get(&c, "/v1/pets", &one).await;
    }

    // A response is counted in its logging phase, after the client has it: wait for the last.
    let last = r#"gateway_responses_total{method="GET",outcome="key_banned",route="/v1/pets",status="429"}"#;
    common::wait_metric(stack.admin, last, Duration::from_secs(5), |v| v >= 2.0);
    let m = |name: &str| metric(stack.admin, name);
    let responses = |labels: &str| m(&format!("gateway_responses_total{{{labels}}}"));
    assert_eq!(
        responses(r#"method="GET",outcome="proxied",route="/v1/pets",status="200""#),
        Some(4.0)
    );
    assert_eq!(
        responses(r#"method="POST",outcome="proxied",route="/v1/pets",status="201""#),
        Some(1.0)
    );
    assert_eq!(
        responses(r#"method="GET",outcome="unauthorized",route="/v1/pets",status="401""#),
        Some(2.0)
    );
    assert_eq!(
        responses(r#"method="GET",outcome="not_found",route="none",status="404""#),
        Some(1.0)
    );
    assert_eq!(
        responses(r#"method="GET",outcome="answered",route="rate_limit",status="200""#),
        Some(1.0)
    );
    assert_eq!(
        responses(r#"method="GET",outcome="answered",route="pages",status="200""#),
        Some(1.0)
    );
    assert_eq!(
        responses(r#"method="GET",outcome="rate_limited",route="/v1/pets",status="429""#),
        Some(10.0)
    );
    assert_eq!(
        responses(r#"method="GET",outcome="key_banned",route="/v1/pets",status="429""#),
        Some(2.0)
    );
    assert_eq!(
        m(r#"gateway_refusals_total{plan="enterprise",reason="rate_limited"}"#),
        Some(10.0)
    );
    assert_eq!(
        m(r#"gateway_refusals_total{plan="enterprise",reason="key_banned"}"#),
        Some(2.0)
    );
    assert_eq!(m(r#"gateway_bans_total{plan="enterprise"}"#), Some(1.0));
    assert_eq!(
        m(r#"gateway_auth_failures_total{reason="missing"}"#),
        Some(1.0)
    );
    assert_eq!(
        m(r#"gateway_auth_failures_total{reason="unknown_key"}"#),
        Some(1.0)
    );
    assert_eq!(
        m(r#"gateway_upstream_duration_seconds_count{route="/v1/pets"}"#),
        Some(5.0)
    );
    let text = common::raw_http(
        stack.admin,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .2;
    assert!(!text.contains("/v1/nothing"), "paths never become labels");
    assert!(!text.contains(key_id(&pro)), "keys never become labels");
}

#[tokio::test]
async fn the_access_log_is_one_json_object_per_line_and_never_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start_with_text(dir.path(), &format!("access_log = \"json\"\n{PETS_ROUTE}"));
    let key = stack.key(&["--plan", "pro"]);
    let c = client();
    let ok = stack.get(&c, "/v1/pets?limit=1", &key).await;
    let ok_id = ok.headers()["x-request-id"].to_str().unwrap().to_owned();
    let refused = c.get(stack.url("/v1/pets")).send().await.unwrap();
    let refused_id = refused.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    stack.proc.wait_log(&ok_id);
    let log = stack.proc.wait_log(&refused_id);
    let lines: Vec<Value> = log
        .lines()
        .filter_map(|l| l.split_once(" access] ").map(|(_, json)| json))
        .map(|json| serde_json::from_str(json).expect("each access line is one JSON object"))
        .collect();
    let find = |id: &str| {
        lines
            .iter()
            .find(|l| l["request_id"] == id)
            .cloned()
            .expect("logged")
    };
    let line = find(&ok_id);
    assert_eq!(line["key_id"], key_id(&key));
    assert_eq!(line["plan"], "pro");
    assert_eq!(line["method"], "GET");
    assert_eq!(line["path"], "/v1/pets", "no query string");
    assert_eq!(line["route"], "/v1/pets");
    assert_eq!(line["upstream"], stack.backend.to_string());
    assert_eq!(line["status"], 200);
    assert_eq!(line["decision"], "admitted");
    assert_eq!(line["client"], "127.0.0.1");
    assert!(line["latency_ms"].as_f64().unwrap() > 0.0);
    assert!(line["time"].as_str().unwrap().ends_with('Z'));
    let line = find(&refused_id);
    assert_eq!(
        (line["status"].as_u64(), line["decision"].as_str()),
        (Some(401), Some("unauthorized"))
    );
    assert_eq!(line["key_id"], Value::Null);
    assert!(
        !log.contains(&key[20..]),
        "the key's secret is never logged"
    );
}

/// Operators turn the log up to `debug` to see what clients send. pingora's debug lines then quote
/// a request head it cannot parse, as read, and each request sent upstream with its query: a key
/// in either reaches the log as its public id and `[redacted]`, never with its secret.
#[tokio::test]
async fn keys_never_reach_the_log_even_at_debug() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::launch_after(
        Some("export RUST_LOG=debug"),
        dir.path(),
        dir.path().join("data"),
        &common::shipped_config(),
        &[],
    );
    let key = stack.key(&["--plan", "pro"]);
    let folded = format!(
        "GET /v1/pets HTTP/1.1\r\nHost: x\r\nX-Folded: 1\r\n  2\r\nAuthorization: Bearer {key}\r\n\r\n"
    );
    assert_eq!(common::raw_http(stack.listen, folded.as_bytes()).0, 400);
    stack.proc.wait_log("InvalidHTTPHeader");
    let c = client();
    let in_query = stack
        .get(&c, &format!("/v1/pets?limit=1&api_key={key}"), &key)
        .await;
    assert_eq!(in_query.status(), 400, "the backend knows no `api_key`");
    stack.proc.wait_log("Sending header to upstream");

    let log = stack.proc.log_text();
    let shown = format!("{}_[redacted]", &key[..19]);
    assert!(
        log.lines().filter(|l| l.contains(&shown)).count() >= 2,
        "both lines name the key by its id: {log}"
    );
    assert!(
        !log.contains(&key[20..36]),
        "no part of the secret is logged: {log}"
    );
}

/// Sends `n` requests with a bad key and `X-Forwarded-For: xff`; returns the last status.
async fn bad_keys(stack: &Stack, c: &reqwest::Client, xff: &str, n: usize) -> u16 {
    let mut status = 0;
    for _ in 0..n {
        status = c
            .get(stack.url("/v1/pets"))
            .bearer_auth("as_0000000000000000_nope")
            .header("X-Forwarded-For", xff)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
    }
    status
}

/// Behind a trusted load balancer each client has its own failed-auth budget; from anyone
/// else `X-Forwarded-For` is not believed, so it cannot be used to dodge the budget. Upstream,
/// the client address as the gateway judged it is appended to a trusted proxy's header, and
/// replaces anyone else's; the scheme a trusted proxy says the client used (`X-Forwarded-Proto`,
/// a load balancer that ended TLS) is kept, anyone else's replaced by the connection's own.
#[tokio::test]
async fn forwarded_headers_are_believed_only_from_trusted_proxies() {
    let c = client();
    // Trusted: the loopback peer is the load balancer.
    let dir = tempfile::tempdir().unwrap();
    let orders = common::TestUpstream::start(std::time::Duration::ZERO).await;
    let stack = Stack::start_with_text(
        dir.path(),
        &format!(
            "trusted_proxies = [\"127.0.0.1/32\"]\naccess_log = \"json\"\n{PETS_ROUTE}\n[[gateway.routes]]\nprefix = \"/v1/echo\"\nupstream = \"{}\"\n",
            orders.addr
        ),
    );
    assert_eq!(bad_keys(&stack, &c, "203.0.113.7", 60).await, 401);
    assert_eq!(
        bad_keys(&stack, &c, "203.0.113.7", 1).await,
        429,
        "that client's budget is spent"
    );
    assert_eq!(
        bad_keys(&stack, &c, "6.6.6.6, 198.51.100.8", 1).await,
        401,
        "another client still has its own"
    );
    let key = stack.key(&["--plan", "pro"]);
    let r = c
        .get(stack.url("/v1/echo/x"))
        .bearer_auth(&key)
        .header("X-Forwarded-For", "198.51.100.8")
        .header("X-Forwarded-Proto", "https")
        .send()
        .await
        .unwrap();
    let echo: Value = r.json().await.unwrap();
    assert_eq!(
        echo["headers"]["x-forwarded-for"], "198.51.100.8, 198.51.100.8",
        "the client, appended"
    );
    assert_eq!(
        echo["headers"]["x-forwarded-proto"], "https",
        "the scheme the load balancer says the client used"
    );
    stack.proc.wait_log(r#""client":"198.51.100.8""#); // the access log names the client

    // Not trusted (the default): the header changes nothing, and upstream never sees it: the
    // peer is the client, alone, so an upstream reading the leftmost entry is not fooled.
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start_with_text(
        dir.path(),
        &format!(
            "{PETS_ROUTE}\n[[gateway.routes]]\nprefix = \"/v1/echo\"\nupstream = \"{}\"\n",
            orders.addr
        ),
    );
    for i in 0..60 {
        assert_eq!(
            bad_keys(&stack, &c, &format!("203.0.113.{i}"), 1).await,
            401
        );
    }
    assert_eq!(
        bad_keys(&stack, &c, "198.51.100.99", 1).await,
        429,
        "a forged header does not dodge the budget"
    );
    let key = stack.key(&["--plan", "pro"]);
    let r = c
        .get(stack.url("/v1/echo/x"))
        .bearer_auth(&key)
        .header("X-Forwarded-For", "1.2.3.4")
        .header("X-Forwarded-Proto", "https")
        .send()
        .await
        .unwrap();
    let echo: Value = r.json().await.unwrap();
    assert_eq!(
        echo["headers"]["x-forwarded-for"], "127.0.0.1",
        "the peer is the client, alone"
    );
    assert_eq!(
        echo["headers"]["x-forwarded-proto"], "http",
        "the connection's scheme, not the client's word"
    );
}

/// The limiter asks for transparent huge pages for its large tables (`gateway/src/slot_memory.rs`):
/// the running binary must leave them on for the process, as its allocator (mimalloc, built with
/// `no_thp`) does; an allocator setting that turned them off would make every decision among a
/// million keys wait for a page walk again, with nothing else to show for it.
#[test]
fn the_running_gateway_leaves_huge_pages_on_for_the_regions_that_ask() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let status = std::fs::read_to_string(format!("/proc/{}/status", stack.proc.pid())).unwrap();
    // Linux has said so since 5.0; an older kernel has no line to read.
    if let Some(line) = status.lines().find(|l| l.starts_with("THP_enabled:")) {
        assert_eq!(line.split_whitespace().nth(1), Some("1"), "{line}");
    }
}

/// `/metrics` says how many keys the embedded limit store holds and what its table takes, as of
/// its last pass (each second), from the start, and again at once after a restart restores them.
#[tokio::test]
async fn metrics_show_the_limiters_keys_and_the_bytes_of_its_table() {
    let dir = tempfile::tempdir().unwrap();
    let mut stack = Stack::start(dir.path());
    let m = |admin, name: &str| metric(admin, name).unwrap_or_else(|| panic!("{name} is shown"));
    assert_eq!(m(stack.admin, "gateway_limiter_keys"), 0.0);
    let empty = m(stack.admin, "gateway_limiter_bytes");
    assert!((1.0..65536.0).contains(&empty), "{empty} bytes with no key");

    let keys: Vec<String> = (0..3).map(|_| stack.key(&["--plan", "pro"])).collect();
    let c = client();
    for key in &keys {
        assert_eq!(stack.get(&c, "/v1/pets", key).await.status(), 200);
    }
    common::wait_metric(
        stack.admin,
        "gateway_limiter_keys",
        Duration::from_secs(5),
        |v| v == 3.0,
    );
    // Each key's shard has its first 8 slots of 64 bytes; two keys may share one (each table
    // hashes with a seed of its own, so which share differs from one process to the next).
    let three_keys = |admin| {
        let grown = m(admin, "gateway_limiter_bytes") - empty;
        assert!(
            [512.0, 1024.0, 1536.0].contains(&grown),
            "the table grew by {grown} bytes for 3 keys"
        );
    };
    three_keys(stack.admin);

    assert_eq!(stack.proc.terminate(), Some(0));
    let stack = Stack::launch(dir.path(), stack.data_dir.clone(), &stack.config);
    assert_eq!(m(stack.admin, "gateway_limiter_keys"), 3.0, "restored");
    three_keys(stack.admin);
}
