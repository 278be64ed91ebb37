//! Routing, forwarding, deprecation, upstream failures and path safety, through the real binary.

mod common;

use std::time::{Duration, Instant};

use common::{
    PETS_ROUTE, Stack, TestUpstream, assert_error, client, header, key_id, links, metric, raw_http,
    wait_metric,
};
use serde_json::{Value, json};

fn orders_route(upstream: &TestUpstream, extra: &str) -> String {
    format!(
        "{PETS_ROUTE}\n[[gateway.routes]]\nprefix = \"/v1/store/orders\"\nupstream = \"{}\"\n{extra}\n",
        upstream.addr
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_upstream_is_one_configuration_entry_with_auth_limits_and_headers() {
    let dir = tempfile::tempdir().unwrap();
    let orders = TestUpstream::start(Duration::ZERO).await;
    let stack = Stack::start_with_text(dir.path(), &orders_route(&orders, ""));
    let key = stack.key(&["--plan", "free"]);
    let c = client();

    let r = c
        .get(stack.url("/v1/store/orders/7?expand=items"))
        .bearer_auth(&key)
        .header("X-Forwarded-For", "203.0.113.9")
        .header("X-Api-Plan", "enterprise")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let request_id = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(r.headers()["x-ratelimit-remaining"], "59");
    assert!(r.headers().get("deprecation").is_none());
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["path"], "/v1/store/orders/7?expand=items");
    let seen = &echo["headers"];
    assert!(
        seen.get("authorization").is_none(),
        "the key is not forwarded: {seen}"
    );
    assert_eq!(seen["x-api-key-id"], key_id(&key));
    assert_eq!(seen["x-api-plan"], "free", "a client cannot claim a plan");
    assert_eq!(seen["x-request-id"], request_id.as_str());
    assert_eq!(
        seen["x-forwarded-for"], "127.0.0.1",
        "a client's X-Forwarded-For is not passed on"
    );

    // Without a key: 401 from the gateway, and the upstream never sees the request.
    let hits = orders.hits();
    let r = c.get(stack.url("/v1/store/orders/7")).send().await.unwrap();
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    assert_error(r, 401, "unauthorized").await;
    let r = c
        .get(stack.url("/v1/store/orders/7"))
        .bearer_auth("as_0000000000000000_00")
        .send()
        .await
        .unwrap();
    assert_error(r, 401, "unauthorized").await;
    assert_eq!(orders.hits(), hits);

    // Counts against the same key as the pets routes.
    let r = stack.get(&c, "/v1/pets", &key).await;
    assert_eq!(r.headers()["x-ratelimit-remaining"], "58");
    // No route: 404 from the gateway.
    let r = stack.get(&c, "/v1/store/inventory", &key).await;
    assert!(r.headers().get("x-ratelimit-limit").is_some());
    assert_error(r, 404, "not_found").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deprecation_headers_only_on_get_pet() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "pro"]);
    let c = client();
    let r = c
        .post(stack.url("/v1/pets"))
        .bearer_auth(&key)
        .json(&json!({"name": "Rex", "categoryId": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert!(r.headers().get("deprecation").is_none() && r.headers().get("sunset").is_none());
    let pet: Value = r.json().await.unwrap();
    for path in [
        format!("/v1/pets/{}", pet["id"]),
        "/v1/pets/424242".to_owned(),
        // The same operation spelled with a trailing slash (the backend answers 404 to it).
        format!("/v1/pets/{}/", pet["id"]),
    ] {
        let r = c
            .get(stack.url(&path))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["deprecation"], "@1764892800", "{path}");
        assert_eq!(r.headers()["sunset"], "Thu, 05 Dec 2030 00:00:00 GMT");
        let links = links(&r);
        assert!(
            links.contains(&"</v1/pets>; rel=\"successor-version\""),
            "{links:?}"
        );
        assert!(
            links.iter().any(|l| l.ends_with("; rel=\"deprecation\"")),
            "{links:?}"
        );
    }
    // Even the gateway's own refusals on that operation carry them.
    let r = c.get(stack.url("/v1/pets/1")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers().get("sunset").is_some());
    let r = stack.get(&c, "/v1/pets", &key).await;
    assert!(r.headers().get("deprecation").is_none() && r.headers().get("link").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_sunset_the_operation_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let past = PETS_ROUTE
        .replace("2030-12-05T00:00:00Z", "2021-01-01T00:00:00Z")
        .replace("2025-12-05T00:00:00Z", "2020-01-01T00:00:00Z");
    let stack = Stack::start_with_text(dir.path(), &past);
    let key = stack.key(&["--plan", "pro"]);
    let c = client();
    for path in ["/v1/pets/1", "/v1/pets/1/"] {
        let r = stack.get(&c, path, &key).await;
        assert_eq!(
            r.headers()["sunset"],
            "Fri, 01 Jan 2021 00:00:00 GMT",
            "{path}"
        );
        assert_error(r, 410, "gone").await;
    }
    assert_eq!(stack.get(&c, "/v1/pets", &key).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_sunset_a_route_configured_to_forward_keeps_forwarding() {
    let dir = tempfile::tempdir().unwrap();
    let past = PETS_ROUTE
        .replace("2030-12-05T00:00:00Z", "2021-01-01T00:00:00Z")
        .replace(
            "documentation = ",
            "after_sunset = \"forward\"\ndocumentation = ",
        );
    let stack = Stack::start_with_text(dir.path(), &past);
    let key = stack.key(&["--plan", "pro"]);
    let r = stack.get(&client(), "/v1/pets/1", &key).await;
    assert_eq!(r.headers()["sunset"], "Fri, 01 Jan 2021 00:00:00 GMT");
    assert_error(r, 404, "not_found").await; // forwarded: the backend has no pet 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_upstream_is_502_and_slow_upstream_is_504_while_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let slow = TestUpstream::start(Duration::from_secs(5)).await;
    let closed = common::free_addr();
    let routes = format!(
        "{}\n[[gateway.routes]]\nprefix = \"/v1/closed\"\nupstream = \"{closed}\"\n",
        orders_route(&slow, "timeout_ms = 500")
    );
    let stack = Stack::start_with_text(dir.path(), &routes);
    let key = stack.key(&["--plan", "pro"]);
    let c = client();

    let r = stack.get(&c, "/v1/closed/x", &key).await;
    assert!(r.headers().get("x-ratelimit-remaining").is_some());
    assert!(r.headers().get("x-request-id").is_some());
    assert_error(r, 502, "bad_gateway").await;

    let started = Instant::now();
    let slow_request = tokio::spawn({
        let (c, url, key) = (c.clone(), stack.url("/v1/store/orders/1"), key.clone());
        async move { c.get(url).bearer_auth(key).send().await.unwrap() }
    });
    // While that request waits on the slow upstream, others are served.
    let r = stack.get(&c, "/v1/pets", &key).await;
    assert_eq!(r.status(), 200);
    let r = slow_request.await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered at the 500 ms timeout, not after the upstream"
    );
    assert!(r.headers().get("x-ratelimit-limit").is_some());
    assert_error(r, 504, "gateway_timeout").await;
}

/// A load test ends with its clients closing connections that have requests in flight, through
/// the gateway and, in turn, to the backend; other clients close or reset a connection in the
/// middle of a request head. Nothing failed: with the default log settings (`RUST_LOG` unset)
/// none of it is logged as an error, and the metrics count the requests as `client_closed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_go_away_mid_request_are_not_logged_as_errors() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let slow = TestUpstream::start(Duration::from_secs(1)).await;
    let config = Stack::config_with_text(dir.path(), &orders_route(&slow, "timeout_ms = 10000"));
    let stack = Stack::launch_after(
        Some("unset RUST_LOG"),
        dir.path(),
        dir.path().join("data"),
        &config,
        &[],
    );
    let key = stack.key(&["--plan", "pro"]);
    let request = format!(
        "GET /v1/store/orders/1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n"
    );
    let mut gone = Vec::new();
    for _ in 0..10 {
        let mut s = std::net::TcpStream::connect(stack.listen).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        gone.push(s);
        // And to the gateway and the backend, heads cut short.
        for to in [stack.listen, stack.backend] {
            let mut s = std::net::TcpStream::connect(to).unwrap();
            s.write_all(b"GET /v1/pets HTTP/1.1\r\nHost:").unwrap();
            gone.push(s);
        }
    }
    let mut reset = tokio::net::TcpStream::connect(stack.listen).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut reset, b"GET /v1/pets HTTP/1.1\r\n")
        .await
        .unwrap();
    reset.set_zero_linger().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(gone);
    drop(reset);
    // The upstream answers after 1 s; the gateway then finds each client gone.
    common::wait_client_closed(stack.admin, "/v1/store/orders", 10.0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = stack.proc.log_text();
    assert!(!log.contains(" ERROR "), "{log}");
    assert!(
        log.contains(" INFO "),
        "the default log level is info: {log}"
    );
}

/// A client that goes away while its upstream is still working is let go at once: the gateway
/// reads the client's close while it waits for the upstream, closes the upstream connection
/// without waiting for an answer or for the route's 30 s timeout, and counts the request as the
/// client's close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_while_the_upstream_works_is_let_go_at_once() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let (upstream, head_read, seen) = common::silent_upstream();
    let stack = Stack::start_with_text(
        dir.path(),
        &format!(
            "{PETS_ROUTE}\n[[gateway.routes]]\nprefix = \"/v1/store\"\nupstream = \"{upstream}\"\ntimeout_ms = 30000\n"
        ),
    );
    let key = stack.key(&["--plan", "pro"]);
    let mut client = std::net::TcpStream::connect(stack.listen).unwrap();
    client
        .write_all(
            format!(
                "GET /v1/store/orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n"
            )
            .as_bytes(),
        )
        .unwrap();
    head_read.recv_timeout(Duration::from_secs(10)).unwrap();
    drop(client);
    assert_eq!(
        seen.recv_timeout(Duration::from_secs(15)).unwrap(),
        "closed"
    );
    common::wait_client_closed(stack.admin, "/v1/store", 1.0).await;
}

/// The header timeout bounds reading a request's head, not answering it: a request proxied to
/// an upstream slower than `header_timeout_seconds` is answered, on a connection that stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_header_timeout_ends_when_the_head_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let slow = TestUpstream::start(Duration::from_secs(2)).await;
    let routes = format!(
        "header_timeout_seconds = 1\n{}",
        orders_route(&slow, "timeout_ms = 10000")
    );
    let stack = Stack::start_with_text(dir.path(), &routes);
    let key = stack.key(&["--plan", "pro"]);
    let c = client();
    for _ in 0..2 {
        let r = stack.get(&c, "/v1/store/orders/1", &key).await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!(
        common::metric(
            stack.admin,
            "gateway_client_timeouts_total{phase=\"header\"}"
        ),
        Some(0.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_down_gives_502_then_recovers() {
    let dir = tempfile::tempdir().unwrap();
    // The data directory `GatewayOnly::start` gives a gateway named "gw"; the backend shares it.
    let data = dir.path().join("gateway-gw");
    let config = common::shipped_config();
    let (code, key, _) = common::cli(&[
        "keys",
        "create",
        "--plan",
        "pro",
        "--data-dir",
        data.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ]);
    assert_eq!(code, 0);
    let key = key.trim().to_owned();
    let backend_addr = common::free_addr();
    let mut gateway = common::GatewayOnly::start(dir.path(), "gw", &config, backend_addr, &[]);
    let listen = gateway.listen;
    let c = client();
    let url = format!("http://{listen}/v1/pets");
    assert_error(
        c.get(&url).bearer_auth(&key).send().await.unwrap(),
        502,
        "bad_gateway",
    )
    .await;

    // Start the backend on the address the gateway points to: it recovers without a restart.
    let start_backend = |log: &str| {
        let mut backend = common::Proc::start(
            &[
                "backend",
                "--config",
                config.to_str().unwrap(),
                "--data-dir",
                data.to_str().unwrap(),
                "--backend-listen",
                &backend_addr.to_string(),
            ],
            dir.path().join(log),
        );
        common::wait_for_port(backend_addr, &mut backend.child);
        backend
    };
    let mut backend = start_backend("backend.log");
    assert_eq!(
        c.get(&url).bearer_auth(&key).send().await.unwrap().status(),
        200
    );
    backend.kill9();
    assert_error(
        c.get(&url).bearer_auth(&key).send().await.unwrap(),
        502,
        "bad_gateway",
    )
    .await;
    // Crashed and restarted: the gateway drops its dead pooled connections and recovers.
    let _backend = start_backend("backend-2.log");
    for _ in 0..5 {
        assert_eq!(
            c.get(&url).bearer_auth(&key).send().await.unwrap().status(),
            200
        );
    }
    assert_eq!(gateway.proc.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_paths_are_refused_before_any_decision() {
    let dir = tempfile::tempdir().unwrap();
    let orders = TestUpstream::start(Duration::ZERO).await;
    let stack = Stack::start_with_text(dir.path(), &orders_route(&orders, ""));
    let key = stack.key(&["--plan", "pro"]);
    for target in [
        "/v1/store/orders/../../pets",
        "/v1/store/orders/./1",
        "/v1/store/orders/%2e%2e/x",
        "/v1/store/orders%2F1",
        "/v1/store/orders%2f1",
        "/v1/store/orders%5C1",
        "/v1/store/orders/1%00",
        "/v1//store/orders",
        "/v1/store/orders/%zz",
    ] {
        let request = format!(
            "GET {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
        );
        let (status, headers, body) = raw_http(stack.listen, request.as_bytes());
        assert_eq!(status, 400, "{target}");
        assert_eq!(header(&headers, "content-type"), Some("application/json"));
        assert!(header(&headers, "x-ratelimit-limit").is_some(), "{target}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["code"], "invalid_request", "{target}");
    }
    assert_eq!(orders.hits(), 0, "nothing ambiguous reached the upstream");
    // Encoded unreserved characters are decoded, and the decoded path is what is forwarded.
    let request = format!(
        "GET /v1/store/%6Frders/5 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    );
    let (status, _, body) = raw_http(stack.listen, request.as_bytes());
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["path"],
        "/v1/store/orders/5"
    );
    // Hop-by-hop headers, and those the client's Connection header names, stay on this hop.
    let request = format!(
        "GET /v1/store/orders/6 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nConnection: close, X-Hop\r\nX-Hop: secret\r\nKeep-Alive: timeout=5\r\nProxy-Authorization: Basic eA==\r\nX-End-To-End: kept\r\nX_Api_Key_Id: 0000000000000001\r\nX_Api_Plan: enterprise\r\nX_Forwarded-For: 192.0.2.1\r\nX-Request_Id: forged\r\nX_End_To_End: kept too\r\n\r\n"
    );
    let (status, _, body) = raw_http(stack.listen, request.as_bytes());
    assert_eq!(status, 200);
    let seen = &serde_json::from_str::<Value>(&body).unwrap()["headers"];
    for hop in [
        "x-hop",
        "keep-alive",
        "proxy-authorization",
        "authorization",
    ] {
        assert!(seen.get(hop).is_none(), "{hop} was forwarded: {seen}");
    }
    assert_eq!(seen["x-end-to-end"], "kept");
    // Each alone, in a request without `Connection` (reqwest sends none), stays on this hop too.
    let c = reqwest::Client::new();
    for (name, value) in [
        ("keep-alive", "timeout=5"),
        ("proxy-connection", "keep-alive"),
        ("proxy-authorization", "Basic eA=="),
        ("proxy-authenticate", "Basic"),
        ("te", "trailers"),
        ("trailer", "X-Sum"),
        ("http2-settings", "AAMAAABkAAQAAP__"),
    ] {
        let r = c
            .get(stack.url("/v1/store/orders/7"))
            .bearer_auth(&key)
            .header(name, value)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{name}");
        let seen = r.json::<Value>().await.unwrap()["headers"].clone();
        assert!(seen.get(name).is_none(), "{name} was forwarded: {seen}");
        assert!(seen.get("connection").is_none(), "{seen}");
        assert_eq!(seen["x-api-key-id"], key_id(&key), "{seen}");
    }
    // A server that reads `_` as `-` (CGI, WSGI, Rack) would take these for the gateway's own.
    for alias in [
        "x_api_key_id",
        "x_api_plan",
        "x_forwarded-for",
        "x-request_id",
    ] {
        assert!(seen.get(alias).is_none(), "{alias} was forwarded: {seen}");
    }
    assert_eq!(seen["x-api-key-id"], key_id(&key));
    assert_eq!(seen["x_end_to_end"], "kept too");
}

/// A request line with a space, a control character or DEL in its target (which pingora's parser
/// refuses, and pingora would then percent-encode and forward: a target the client never sent)
/// is refused with the contract's 400, not corrected, as RFC 9112 asks and nginx does; its
/// connection closes, also when it comes pipelined behind a request that is served. Valid lines,
/// an encoded space and blank lines before the line among them, are forwarded as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_line_with_a_space_or_control_in_its_target_is_refused_not_corrected() {
    let dir = tempfile::tempdir().unwrap();
    let orders = TestUpstream::start(Duration::ZERO).await;
    let stack = Stack::start_with_text(dir.path(), &orders_route(&orders, ""));
    let key = stack.key(&["--plan", "pro"]);
    let get = |target: &str| {
        format!("GET {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n")
    };
    for target in [
        "/v1/store/orders/a b",
        "/v1/store/orders/1 HTTP/1.1",
        "/v1/store/orders/a\tb",
        "/v1/store/orders/a\x7fb",
        "/v1/store/orders/a\x01b",
        "/v1/store/orders/a\rb",
    ] {
        let (answer, closed) = answer_and_close(stack.listen, &get(target));
        assert!(answer.starts_with("HTTP/1.1 400 "), "{target:?}: {answer}");
        let (_, body) = answer.split_once("\r\n\r\n").unwrap();
        let error: Value = serde_json::from_str(body).unwrap();
        assert_eq!(error["code"], "invalid_request", "{target:?}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains("request line"), "{target:?}: {message}");
        assert!(closed, "{target:?}: the connection closes");
    }
    let answers = raw_answer(
        stack.listen,
        &[get("/v1/store/orders/1"), get("/v1/store/orders/a b")].concat(),
    );
    assert_eq!(statuses(&answers), ["200", "400"], "{answers}");
    assert_eq!(
        orders.hits(),
        1,
        "only the valid request reached the upstream"
    );

    for (request, forwarded) in [
        (get("/v1/store/orders/a%20b"), "/v1/store/orders/a%20b"),
        (
            format!("\r\n{}", get("/v1/store/orders/2")),
            "/v1/store/orders/2",
        ),
    ] {
        let request = request.replace("\r\n\r\n", "\r\nConnection: close\r\n\r\n");
        let (status, _, body) = raw_http(stack.listen, request.as_bytes());
        assert_eq!(status, 200, "{request:?}: {body}");
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap()["path"],
            forwarded
        );
    }
}

/// A body whose framing two readers could take differently is refused, as is an HTTP/1.1
/// request without `Host`, with two, or with one that differs from the host of a target in
/// absolute form, and the connection closes: what came before the gateway may have
/// read the bytes otherwise, so nothing more is read from it. `Transfer-Encoding` beside
/// `Content-Length` is read as chunked and forwarded without the length (RFC 9112), and that
/// connection closes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_framed_ambiguously_is_refused_and_its_connection_closed() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "pro"]);
    let pet = r#"{"name":"Rex","categoryId":1}"#;
    let chunked = format!("{:x}\r\n{pet}\r\n0\r\n\r\n", pet.len());
    let post = |framing: &str, body: &str| {
        format!(
            "POST /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\n{framing}\r\n{body}"
        )
    };
    let n = pet.len();
    for (case, request) in [
        (
            "two lengths",
            post(
                &format!("Content-Length: {n}\r\nContent-Length: {n}\r\n"),
                pet,
            ),
        ),
        (
            "a list of lengths",
            post(&format!("Content-Length: {n}, {n}\r\n"), pet),
        ),
        (
            "gzip, then chunked",
            post("Transfer-Encoding: gzip, chunked\r\n", &chunked),
        ),
        (
            "chunked twice",
            post(
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                &chunked,
            ),
        ),
        (
            "no Host",
            format!("GET /v1/pets HTTP/1.1\r\nAuthorization: Bearer {key}\r\n\r\n"),
        ),
        (
            "two Hosts",
            format!(
                "GET /v1/pets HTTP/1.1\r\nHost: x\r\nHost: y\r\nAuthorization: Bearer {key}\r\n\r\n"
            ),
        ),
        (
            "a Host other than the target's",
            format!(
                "GET http://y/v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n"
            ),
        ),
    ] {
        let (answer, closed) = answer_and_close(stack.listen, &request);
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        assert!(head.starts_with("HTTP/1.1 400 "), "{case}: {answer}");
        let body: Value =
            serde_json::from_str(body).unwrap_or_else(|e| panic!("{case}: {e}: {answer}"));
        assert_eq!(body["code"], "invalid_request", "{case}");
        assert!(closed, "{case}: the connection stayed open");
    }
    let c = client();
    let pets: Value = stack.get(&c, "/v1/pets", &key).await.json().await.unwrap();
    assert_eq!(pets, json!([]), "no refused create reached the backend");

    // Both: the body is read as chunked, the length is not forwarded, the connection closes.
    let (answer, closed) = answer_and_close(
        stack.listen,
        &post(
            "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n",
            &chunked,
        ),
    );
    assert!(answer.starts_with("HTTP/1.1 201 "), "{answer}");
    assert!(answer.contains(r#""name":"Rex""#), "{answer}");
    assert!(
        closed,
        "the connection stayed open after Content-Length beside chunked"
    );
    // The target in absolute form, with the same host as `Host`: read as usual.
    let (answer, _) = answer_and_close(
        stack.listen,
        &format!(
            "GET http://x/v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
        ),
    );
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    // One chunked coding, in any case; HTTP/1.0 without Host: read as usual.
    let (answer, _) = answer_and_close(
        stack.listen,
        &post(
            "Transfer-Encoding: Chunked\r\nConnection: close\r\n",
            &chunked,
        ),
    );
    assert!(answer.starts_with("HTTP/1.1 201 "), "{answer}");
    let (answer, _) = answer_and_close(
        stack.listen,
        &format!("GET /v1/pets HTTP/1.0\r\nAuthorization: Bearer {key}\r\n\r\n"),
    );
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
}

/// The answer to `request` on a new connection, and whether the gateway closed the connection
/// after it (rather than leaving it open for 20 s).
fn answer_and_close(addr: std::net::SocketAddr, request: &str) -> (String, bool) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let closed = stream.read_to_end(&mut answer).is_ok();
    (String::from_utf8_lossy(&answer).into_owned(), closed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_over_the_gateway_limit_get_413_without_reaching_the_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let orders = TestUpstream::start(Duration::ZERO).await;
    let stack = Stack::start_with_text(
        dir.path(),
        &format!("max_body_bytes = 4096\n{}", orders_route(&orders, "")),
    );
    let key = stack.key(&["--plan", "pro"]);
    let c = client();
    let big = "x".repeat(5000);
    let r = c
        .post(stack.url("/v1/store/orders"))
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .body(big.clone())
        .send()
        .await
        .unwrap();
    assert_error(r, 413, "payload_too_large").await;
    assert_eq!(orders.hits(), 0);
    let chunks: Vec<Result<String, std::io::Error>> =
        (0..5).map(|_| Ok("y".repeat(1000))).collect();
    let r = c
        .post(stack.url("/v1/store/orders"))
        .bearer_auth(&key)
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    // Found too large while streaming (no length declared), it says the limit just the same.
    let error = assert_error(r, 413, "payload_too_large").await;
    assert_eq!(
        error["message"], "the request body is larger than 4096 bytes",
        "{error}"
    );
    let r = c
        .post(stack.url("/v1/store/orders"))
        .bearer_auth(&key)
        .body("z".repeat(4000))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "under the limit is forwarded");
    // The backend's own limit (16 KiB) still applies on the pets route.
    let stack_default = Stack::start(&dir.path().join("second"));
    let key = stack_default.key(&["--plan", "pro"]);
    let body = format!(r#"{{"name":"{}","categoryId":1}}"#, "n".repeat(20_000));
    let r = c
        .post(stack_default.url("/v1/pets"))
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("x-ratelimit-limit").is_some());
    assert_error(r, 413, "payload_too_large").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_half_open_connections_do_not_stop_the_gateway() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "pro"]);
    let mut idle = Vec::new();
    for _ in 0..200 {
        let mut s = std::net::TcpStream::connect(stack.listen).unwrap();
        s.write_all(b"GET /v1/pets HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        idle.push(s);
    }
    let c = client();
    for _ in 0..20 {
        let r = stack.get(&c, "/v1/pets", &key).await;
        assert_eq!(r.status(), 200);
    }
    drop(idle);
}

/// The soft limit on open files is 1,024 on most systems, and every connection takes a
/// descriptor. Started under a soft limit of 256, `serve` raises it to the hard limit and serves
/// 600 connections held open at once.
#[test]
fn a_low_soft_limit_on_open_files_is_raised_to_the_hard_one() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    use std::io::{Read, Write};
    const CONNECTIONS: usize = 600;
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    assert!(
        hard >= 2 * CONNECTIONS as u64,
        "this test needs a hard limit on open files of at least {}, not {hard}",
        2 * CONNECTIONS
    );
    // This process holds the other ends.
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::launch_after(
        Some("ulimit -Sn 256"),
        dir.path(),
        dir.path().join("data"),
        &common::shipped_config(),
        &[],
    );
    let limits =
        std::fs::read_to_string(format!("/proc/{}/limits", stack.proc.child.id())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields[3], hard.to_string(), "{line}");
    assert!(
        stack
            .proc
            .log_text()
            .contains("limit on open files raised from 256"),
        "{}",
        stack.proc.log_text()
    );

    let key = stack.enterprise_key(1_000_000, 1_000_000);
    let request =
        format!("GET /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n");
    let mut open = Vec::with_capacity(CONNECTIONS);
    for i in 0..CONNECTIONS {
        let mut s = std::net::TcpStream::connect(stack.listen).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut head = [0u8; 12];
        let read = s.read_exact(&mut head);
        assert!(
            read.is_ok() && &head == b"HTTP/1.1 200",
            "connection {i}: {read:?} {:?}",
            String::from_utf8_lossy(&head)
        );
        open.push(s);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_listener_serves_health_readiness_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "pro"]);
    let c = client();
    stack.get(&c, "/v1/pets", &key).await;
    c.get(stack.url("/v1/pets")).send().await.unwrap();
    let admin = |p: &str| format!("http://{}{p}", stack.admin);
    assert_eq!(c.get(admin("/healthz")).send().await.unwrap().status(), 200);
    assert_eq!(c.get(admin("/readyz")).send().await.unwrap().status(), 200);
    assert_error(
        c.get(admin("/nope")).send().await.unwrap(),
        404,
        "not_found",
    )
    .await;
    // A response is counted in its logging phase, after the client has it: the last one may
    // still be on its way into the metrics.
    let admin_addr = stack.admin;
    tokio::task::spawn_blocking(move || {
        let unauthorized = r#"gateway_responses_total{method="GET",outcome="unauthorized",route="/v1/pets",status="401"}"#;
        wait_metric(admin_addr, unauthorized, Duration::from_secs(5), |v| v >= 1.0);
    })
    .await
    .unwrap();
    let metrics = c
        .get(admin("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(
            r#"gateway_responses_total{method="GET",outcome="proxied",route="/v1/pets",status="200"} 1"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"gateway_responses_total{method="GET",outcome="unauthorized",route="/v1/pets",status="401"} 1"#
        ),
        "{metrics}"
    );
    assert!(metrics.contains("gateway_active_keys 2"), "{metrics}");
    assert!(!metrics.contains(&key[20..]), "no key material in metrics");
    // The public listener does not serve admin paths.
    let r = stack.get(&c, "/metrics", &key).await;
    assert_error(r, 404, "not_found").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_request_headers_are_refused_with_the_contract_error() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "pro"]);
    let request = |extra: &str| {
        format!(
            "GET /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n{extra}Connection: close\r\n\r\n"
        )
    };
    let many: String = (0..120).map(|i| format!("X-Filler-{i}: y\r\n")).collect();
    let big = format!("X-Big: {}\r\n", "b".repeat(20 * 1024));
    for extra in [many, big] {
        let (status, headers, body) = raw_http(stack.listen, request(&extra).as_bytes());
        assert_eq!(status, 400);
        assert!(header(&headers, "x-ratelimit-limit").is_some());
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap()["code"],
            "invalid_request"
        );
    }
    // Within the limits: served.
    let (status, _, _) = raw_http(
        stack.listen,
        request(&format!("X-Ok: {}\r\n", "o".repeat(8 * 1024))).as_bytes(),
    );
    assert_eq!(status, 200);
    // Past pingora's own parser limits (256 headers): the contract's 400 all the same, and the
    // gateway keeps serving.
    let absurd: String = (0..300).map(|i| format!("X-F{i}: y\r\n")).collect();
    let (status, _, body) = raw_http(stack.listen, request(&absurd).as_bytes());
    assert_eq!(status, 400);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["code"],
        "invalid_request"
    );
    let (status, _, _) = raw_http(stack.listen, request("").as_bytes());
    assert_eq!(status, 200);
}

/// Requests pingora refuses before any hook of the gateway runs (it cannot parse them, or they
/// are `CONNECT`) get the contract's JSON error, not pingora's empty answer, and are counted.
#[test]
fn requests_the_parser_refuses_get_the_contract_error() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "pro"]);
    let get = format!("GET /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n");
    let unparsable = [
        "NONSENSE\r\n\r\n".to_owned(),
        "GET /v1/pets HTTP/1.1\r\nHost: x\r\nX-Bad: \x01\r\n\r\n".to_owned(),
        "GET /v1/pets HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"
            .to_owned(),
        "GET /v1/pets HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n".to_owned(),
        // Behind a request that is answered: that answer first, then the refusal.
        format!("{get}NONSENSE\r\n\r\n"),
    ];
    for request in &unparsable {
        let (status, headers, body) = raw_http(stack.listen, request.as_bytes());
        let body = body
            .rsplit_once("HTTP/1.1 400 ")
            .map_or(body.as_str(), |(_, b)| b);
        let body = body.split_once("\r\n\r\n").map_or(body, |(_, b)| b);
        let error: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
        assert_eq!(error["code"], "invalid_request", "{request:?}");
        assert_eq!(error["status"], 400);
        if request.starts_with("GET /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization") {
            assert_eq!(status, 200, "the request before it is answered first");
        } else {
            assert_eq!(status, 400, "{request:?}");
            assert_eq!(header(&headers, "content-type"), Some("application/json"));
            assert_eq!(header(&headers, "connection"), Some("close"));
            assert_eq!(header(&headers, "x-request-id").map(str::len), Some(24));
        }
    }
    let (status, headers, body) = raw_http(
        stack.listen,
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    );
    assert_eq!(status, 405);
    assert_eq!(header(&headers, "allow"), Some(""));
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["code"], "method_not_allowed");

    // Answers of the gateway and of the upstream, 400 and 405 among them, are untouched; the
    // connection's next request is served; the refusals are counted.
    let close = |request: &str| request.replace("\r\n\r\n", "\r\nConnection: close\r\n\r\n");
    let (status, _, body) = raw_http(
        stack.listen,
        close(&get.replace("Authorization: Bearer", "X-No:")).as_bytes(),
    );
    assert_eq!(status, 401);
    assert!(body.contains("\"unauthorized\""), "{body}");
    let (status, _, body) = raw_http(
        stack.listen,
        close(&get.replace("/v1/pets", "/v1/pets/../pets")).as_bytes(),
    );
    assert_eq!(status, 400);
    assert!(
        body.contains("`.` or `..` segments"),
        "the gateway's own 400: {body}"
    );
    let (status, headers, _) = raw_http(
        stack.listen,
        close(&get.replace("GET /v1/pets", "DELETE /v1/pets")).as_bytes(),
    );
    assert_eq!(status, 405);
    assert_eq!(
        header(&headers, "allow"),
        Some("GET, HEAD, POST"),
        "the backend's own 405"
    );
    let (status, _, rest) = raw_http(stack.listen, format!("{get}{}", close(&get)).as_bytes());
    assert_eq!(status, 200);
    assert!(
        rest.contains("HTTP/1.1 200 OK\r\n"),
        "the second answered too: {rest}"
    );
    let refused = |status: &str, code: &str| {
        metric(
            stack.admin,
            &format!(
                "gateway_responses_total{{method=\"other\",outcome=\"{code}\",route=\"none\",status=\"{status}\"}}"
            ),
        )
    };
    assert_eq!(
        refused("400", "invalid_request"),
        Some(unparsable.len() as f64)
    );
    assert_eq!(refused("405", "method_not_allowed"), Some(1.0));

    // The admin listener answers what it cannot parse too (its valid requests are tested with
    // its paths).
    let (status, headers, body) = raw_http(stack.admin, b"NONSENSE\r\n\r\n");
    assert_eq!(status, 400, "{body}");
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    let error: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
    assert_eq!(error["code"], "invalid_request");
}

/// A client that writes its whole body before reading the answer (as Python's `http.client`
/// does) gets the 413, not a connection reset, from the gateway and from the backend, every
/// time: both drain what they refused for a bounded time, as nginx's `lingering_close` does.
/// 16 MiB is more than loopback's socket buffers hold, so without the draining the writes fail.
#[test]
fn early_refusals_reach_a_client_that_writes_its_whole_body_first() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "business"]);
    let body = vec![b' '; 16 * 1024 * 1024];
    for (addr, auth) in [
        (stack.listen, format!("Authorization: Bearer {key}\r\n")),
        (stack.backend, String::new()),
    ] {
        for attempt in 0..20 {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let head = format!(
                "POST /v1/pets HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).unwrap();
            s.write_all(&body).unwrap_or_else(|e| {
                panic!("{addr}, attempt {attempt}: the body could not be sent: {e}")
            });
            let mut answer = [0u8; 12];
            s.read_exact(&mut answer)
                .unwrap_or_else(|e| panic!("{addr}, attempt {attempt}: no answer: {e}"));
            assert_eq!(&answer, b"HTTP/1.1 413", "{addr}, attempt {attempt}");
        }
    }
}

/// Requests pipelined on one connection (sent together, before any answer is read, as `wrk`
/// with a pipelining script does) are all answered, in order, refusals among them, on the
/// public listener and on the admin listener.
#[test]
fn pipelined_requests_are_answered_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "business"]);
    let get = |path: &str, key: &str, last: bool| {
        let close = if last { "Connection: close\r\n" } else { "" };
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n{close}\r\n")
    };
    let pipelined = [
        get("/v1/pets?limit=1", &key, false),
        get("/v1/pets", "as_0123456789abcdef_00", false),
        get("/v1/pets/12345", &key, false),
        get("/v1/rate_limit", &key, true),
    ]
    .concat();
    let answers = raw_answer(stack.listen, &pipelined);
    assert_eq!(
        statuses(&answers),
        ["200", "401", "404", "200"],
        "{answers}"
    );
    let (_, last) = answers.rsplit_once("\r\n\r\n").unwrap();
    let standing: Value = serde_json::from_str(last).unwrap();
    assert_eq!(
        standing["plan"], "business",
        "the last answer is the last request's"
    );

    // Behind creates, their bodies of declared length and chunked.
    let body = r#"{"name":"Rex","categoryId":1}"#;
    let head = format!(
        "POST /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\n"
    );
    for framing in [
        format!("Content-Length: {}\r\n\r\n{body}", body.len()),
        format!(
            "Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
            body.len()
        ),
    ] {
        let create = format!("{head}{framing}");
        let answers = raw_answer(
            stack.listen,
            &[
                create,
                get("/v1/pets", &key, false),
                get("/v1/rate_limit", &key, true),
            ]
            .concat(),
        );
        assert_eq!(
            answers.matches("HTTP/1.1 ").count(),
            3,
            "{framing}: {answers}"
        );
        assert!(answers.starts_with("HTTP/1.1 201 "), "{answers}");
        assert!(answers.contains("\"plan\":\"business\""), "{answers}");
    }

    // And on the admin listener (pingora's own loop there dropped all but the first).
    let answers = raw_answer(
        stack.admin,
        "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\n\r\n\
         GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(statuses(&answers), ["200", "200", "404"], "{answers}");
    assert!(answers.contains(r#"{"status":"ready"}"#), "{answers}");
}

/// A body holding blank lines (JSON allows them between tokens) is read whole, though reads stop
/// at blank lines, and the next request on the connection is served.
#[test]
fn a_body_with_blank_lines_is_read_whole() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "business"]);
    let body = "{\"name\":\"Rex\",\r\n\r\n\"categoryId\":\n\n1}";
    let mut s = std::net::TcpStream::connect(stack.listen).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let (created, pet) = read_response(&mut s);
    assert!(created.starts_with("HTTP/1.1 201 "), "{created}");
    assert!(pet.contains("\"categoryId\":1"), "{pet}");
    assert_next_request_served(&mut s, &key);
}

/// A refused request whose small body came with it (a POST with a bad key, here with a declared
/// length and chunked) is answered with the connection kept open: the body is read and
/// discarded first, as nginx does, so a client whose POSTs are refused does not reconnect for
/// each refusal. The next request on the connection is served.
#[test]
fn refusals_of_small_bodies_keep_the_connection() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "business"]);
    let body = r#"{"name":"Rex","categoryId":1}"#;
    let framings = [
        format!("Content-Length: {}\r\n\r\n{body}", body.len()),
        format!(
            "Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
            body.len()
        ),
    ];
    for framing in framings {
        let mut s = std::net::TcpStream::connect(stack.listen).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "POST /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer as_0123456789abcdef_00\r\nContent-Type: application/json\r\n{framing}"
        )
        .unwrap();
        let (refused, _) = read_response(&mut s);
        assert!(refused.starts_with("HTTP/1.1 401 "), "{refused}");
        assert!(refused.contains("Connection: keep-alive"), "{refused}");
        assert_next_request_served(&mut s, &key);
    }
    // A client waiting for `100 Continue` before it sends its body is refused at once, not
    // after the gateway has waited the second a body may take to arrive.
    let mut s = std::net::TcpStream::connect(stack.listen).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let asked = Instant::now();
    write!(
        s,
        "POST /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer as_0123456789abcdef_00\r\nContent-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    )
    .unwrap();
    let refused = read_head(&mut s);
    let waited = asked.elapsed();
    assert!(refused.starts_with("HTTP/1.1 401 "), "{refused}");
    assert!(
        waited < Duration::from_millis(900),
        "answered after {waited:?}"
    );
}

/// A create sent with `Expect: 100-continue` (as curl and .NET send large bodies) gets the
/// backend's `100 Continue` as it was sent, then its 201, and the connection stays open for the
/// next request: the interim answer is not taken for one written before the body was read.
#[test]
fn a_request_expecting_100_continue_keeps_its_connection() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "business"]);
    let body = r#"{"name":"Rex","categoryId":1}"#;
    let mut s = std::net::TcpStream::connect(stack.listen).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    )
    .unwrap();
    let interim = read_head(&mut s);
    assert!(interim.starts_with("HTTP/1.1 100 "), "{interim}");
    assert!(
        !interim.contains("RateLimit"),
        "interim answers pass as sent: {interim}"
    );
    s.write_all(body.as_bytes()).unwrap();
    let created = read_head(&mut s);
    assert!(created.starts_with("HTTP/1.1 201 "), "{created}");
    assert!(created.contains("X-RateLimit-Remaining: "), "{created}");
    assert!(created.contains("Connection: keep-alive"), "{created}");
    let pet = read_body(&mut s, &created);
    assert!(pet.contains("\"Rex\""), "{pet}");
    assert_next_request_served(&mut s, &key);
}

/// A chunked body that grows past `max_body_bytes` after the backend's `100 Continue` gets the
/// contract's 413 behind that interim answer, not a connection reset (curl sends its large
/// uploads so); the client's mistake is no warning in the log. A client gone after the
/// `100 Continue` is counted as one that had no response.
#[test]
fn a_body_over_the_limit_after_100_continue_gets_413() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start_with_text(dir.path(), &format!("max_body_bytes = 4096\n{PETS_ROUTE}"));
    let key = stack.key(&["--plan", "business"]);
    let mut s = std::net::TcpStream::connect(stack.listen).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"
    )
    .unwrap();
    let interim = read_head(&mut s);
    assert!(interim.starts_with("HTTP/1.1 100 "), "{interim}");
    let chunk = format!("400\r\n{}\r\n", "a".repeat(1024));
    for _ in 0..8 {
        s.write_all(chunk.as_bytes()).unwrap();
    }
    s.write_all(b"0\r\n\r\n").unwrap();
    let (head, body) = read_response(&mut s);
    assert!(head.starts_with("HTTP/1.1 413 "), "{head}");
    let error: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["code"], "payload_too_large", "{body}");
    let log = stack.proc.log_text();
    assert!(
        !log.contains(" WARN "),
        "a client's mistake, not a warning: {log}"
    );

    // A client that goes away after the `100 Continue` had no response: `status="none"`.
    let mut s = std::net::TcpStream::connect(stack.listen).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"
    )
    .unwrap();
    assert!(read_head(&mut s).starts_with("HTTP/1.1 100 "));
    drop(s);
    wait_metric(
        stack.admin,
        r#"gateway_responses_total{method="POST",outcome="client_closed",route="/v1/pets",status="none"}"#,
        Duration::from_secs(10),
        |v| v == 1.0,
    );
}

/// A response head read from `s` up to its blank line, byte by byte so nothing after it is
/// consumed.
fn read_head(s: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    let mut head = Vec::new();
    let mut byte = [0u8];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            other => panic!(
                "connection ended after {:?}: {other:?}",
                String::from_utf8_lossy(&head)
            ),
        }
    }
    String::from_utf8(head).unwrap()
}

/// A response read from `s`: its head and its body (of the length the head declares).
fn read_response(s: &mut std::net::TcpStream) -> (String, String) {
    let head = read_head(s);
    let body = read_body(s, &head);
    (head, body)
}

/// The body of the response whose `head` was read from `s`.
fn read_body(s: &mut std::net::TcpStream, head: &str) -> String {
    use std::io::Read;
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(str::to_owned)
        })
        .expect("content-length")
        .parse()
        .unwrap();
    let mut body = vec![0; length];
    s.read_exact(&mut body).unwrap();
    String::from_utf8(body).unwrap()
}

/// The connection `s` serves a next request with `key`.
fn assert_next_request_served(s: &mut std::net::TcpStream, key: &str) {
    use std::io::Write;
    write!(
        s,
        "GET /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n"
    )
    .unwrap();
    let listed = read_head(s);
    assert!(listed.starts_with("HTTP/1.1 200 "), "{listed}");
}

/// A keep-alive client connection idle for `gateway.keepalive_timeout_seconds` is closed, as
/// nginx does; one in use is not.
#[test]
fn idle_keep_alive_connections_are_closed_after_the_timeout() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start_with_text(
        dir.path(),
        &format!("keepalive_timeout_seconds = 2\n{PETS_ROUTE}"),
    );
    let key = stack.key(&["--plan", "business"]);
    let request =
        format!("GET /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n");
    let mut s = std::net::TcpStream::connect(stack.listen).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 4096];
    // Busy for longer than the timeout, a request every second: the connection stays.
    for _ in 0..4 {
        s.write_all(request.as_bytes()).unwrap();
        let n = s.read(&mut buf).unwrap();
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&buf[..n])
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    // Then idle: closed after about 2 s, not left open.
    let idle = Instant::now();
    assert_eq!(s.read(&mut buf).unwrap(), 0, "closed by the gateway");
    let waited = idle.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(8),
        "{waited:?}"
    );
}

/// A client that starts a request head and trickles the rest is closed once the head has taken
/// `gateway.header_timeout_seconds`, however steadily it sends; a silent new connection is
/// closed after the keep-alive timeout. Both are counted, and other clients are served
/// meanwhile.
#[test]
fn slow_request_heads_and_silent_connections_are_closed() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start_with_text(
        dir.path(),
        &format!("keepalive_timeout_seconds = 3\nheader_timeout_seconds = 1\n{PETS_ROUTE}"),
    );
    let key = stack.key(&["--plan", "business"]);
    let silent = std::net::TcpStream::connect(stack.listen).unwrap();
    let head = format!("GET /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n");
    let closed_after = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut slow = tokio::net::TcpStream::connect(stack.listen).await.unwrap();
        common::trickle_until_closed(&mut slow, head.as_bytes()).await
    });
    common::assert_closed_at_header_timeout(closed_after, stack.admin);
    let mut buf = [0u8; 256];

    // A well-behaved request on a new connection is served meanwhile.
    let mut quick = std::net::TcpStream::connect(stack.listen).unwrap();
    quick
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    quick.write_all(head.as_bytes()).unwrap();
    let n = quick.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));

    // The connection that never sent a byte goes at the keep-alive timeout.
    wait_metric(
        stack.admin,
        "gateway_client_timeouts_total{phase=\"idle\"}",
        Duration::from_secs(10),
        |v| v >= 1.0,
    );
    let mut silent = silent;
    silent
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    assert_eq!(silent.read(&mut buf).unwrap(), 0, "closed by the gateway");
    drop(quick);
    wait_metric(
        stack.admin,
        "gateway_client_connections",
        Duration::from_secs(10),
        |v| v == 0.0,
    );
}

/// A request body that stops arriving is the client's silence: when the route's timeout passes
/// with the upstream still waiting for it, the connection is closed without an answer and
/// counted as a client timeout, not answered 504 as if the upstream were slow. A body sent
/// slowly but steadily, for longer than that timeout in all, is forwarded and answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_that_stops_arriving_is_a_client_timeout_not_a_504() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let orders = TestUpstream::start(Duration::ZERO).await;
    let stack = Stack::start_with_text(dir.path(), &orders_route(&orders, "timeout_ms = 1000"));
    let key = stack.key(&["--plan", "pro"]);
    let head = format!(
        "POST /v1/store/orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n"
    );

    let mut stalled = tokio::net::TcpStream::connect(stack.listen).await.unwrap();
    stalled.write_all(head.as_bytes()).await.unwrap();
    stalled.write_all(b"[1,2,").await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stalled.read_to_end(&mut answer))
        .await
        .expect("closed by the gateway")
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&answer), "", "no answer");
    let series = |outcome: &str, status: &str| {
        format!(
            r#"gateway_responses_total{{method="POST",outcome="{outcome}",route="/v1/store/orders",status="{status}"}}"#
        )
    };
    // Counted once the request is logged, just after the connection closes.
    wait_metric(
        stack.admin,
        &series("client_timeout", "none"),
        Duration::from_secs(10),
        |v| v == 1.0,
    );
    assert_eq!(
        common::metric(stack.admin, "gateway_client_timeouts_total{phase=\"body\"}"),
        Some(1.0)
    );
    assert_eq!(
        common::metric(stack.admin, &series("gateway_timeout", "504")),
        None
    );
    assert!(
        !stack.proc.log_text().contains("WARN"),
        "{}",
        stack.proc.log_text()
    );

    // Twenty bytes, one every 100 ms: two seconds in all, twice the route's timeout.
    let mut steady = tokio::net::TcpStream::connect(stack.listen).await.unwrap();
    steady.write_all(head.as_bytes()).await.unwrap();
    for byte in b"[1,2,3,4,5,6,7,8,9 ]" {
        tokio::time::sleep(Duration::from_millis(100)).await;
        steady.write_all(&[*byte]).await.unwrap();
    }
    let mut answer = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(20), steady.read(&mut answer))
        .await
        .expect("answered")
        .unwrap();
    assert!(
        answer[..n].starts_with(b"HTTP/1.1 200 "),
        "{:?}",
        String::from_utf8_lossy(&answer[..n])
    );
    assert_eq!(orders.hits(), 1, "only the whole body reached the upstream");
}

/// The admin port bounds its connections as the public port does: a trickled request head is
/// closed at `header_timeout_seconds`, a silent connection at `keepalive_timeout_seconds`. The
/// API's metrics count neither these connections nor their timeouts.
#[test]
fn the_admin_port_closes_slow_heads_and_silent_connections() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start_with_text(
        dir.path(),
        &format!("keepalive_timeout_seconds = 3\nheader_timeout_seconds = 1\n{PETS_ROUTE}"),
    );
    let mut silent = std::net::TcpStream::connect(stack.admin).unwrap();
    let opened = Instant::now();
    let closed_after = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut slow = tokio::net::TcpStream::connect(stack.admin).await.unwrap();
        common::trickle_until_closed(&mut slow, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await
    });
    let closed_after = closed_after.expect("the slow head was never closed");
    assert!(
        closed_after >= Duration::from_millis(900) && closed_after < Duration::from_secs(6),
        "closed after {closed_after:?}, the header timeout is 1 s"
    );

    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(
        silent.read(&mut [0u8; 64]).unwrap(),
        0,
        "closed by the gateway"
    );
    let waited = opened.elapsed();
    assert!(
        waited >= Duration::from_millis(2500) && waited < Duration::from_secs(9),
        "closed after {waited:?}, the keep-alive timeout is 3 s"
    );

    // Read through the admin port itself, which is served meanwhile.
    for name in [
        "gateway_client_timeouts_total{phase=\"header\"}",
        "gateway_client_timeouts_total{phase=\"idle\"}",
        "gateway_client_connections",
    ] {
        assert_eq!(common::metric(stack.admin, name), Some(0.0), "{name}");
    }
}

/// Once shutdown begins, the public port closes its idle connections, but a prober that keeps
/// its admin connection open reads `/readyz`'s 503 during the grace period, and that connection
/// closes after the answer.
#[test]
fn a_kept_admin_connection_reads_stopping_when_shutdown_begins() {
    use nix::sys::signal::{Signal, kill};
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let mut stack = Stack::start_with_text(
        dir.path(),
        &format!("shutdown_grace_seconds = 3\n{PETS_ROUTE}"),
    );
    let probe = b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut prober = std::net::TcpStream::connect(stack.admin).unwrap();
    prober
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    prober.write_all(probe).unwrap();
    let (head, body) = read_response(&mut prober);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}{body}");
    let mut idle = std::net::TcpStream::connect(stack.listen).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // One answered request first: the connection's wait for shutdown outlives a request.
    idle.write_all(b"GET /v1/docs HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let (head, body) = read_response(&mut idle);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}{body}");
    // Accepted, not only queued: a queued connection would be reset with the listener.
    wait_metric(
        stack.admin,
        "gateway_client_connections",
        Duration::from_secs(10),
        |v| v == 1.0,
    );

    kill(stack.proc.pid(), Signal::SIGTERM).unwrap();
    // The gateway is stopping once the public port lets its idle connection go.
    assert_eq!(idle.read(&mut [0u8; 64]).unwrap(), 0, "closed at shutdown");
    prober.write_all(probe).unwrap();
    let (head, body) = read_response(&mut prober);
    assert!(head.starts_with("HTTP/1.1 503 "), "{head}{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["status"],
        "stopping"
    );
    assert_eq!(prober.read(&mut [0u8; 64]).unwrap(), 0, "closed after it");
    assert_eq!(stack.proc.wait_exit(Signal::SIGTERM), Some(0));
}

/// An upstream that answers every request with a header in mixed case and hands back the head
/// of each request it received, as the bytes that arrived.
fn raw_upstream() -> (std::net::SocketAddr, std::sync::mpsc::Receiver<String>) {
    scripted_upstream(|_| {
        (
            // Two of the gateway's own names, in another case, that it must replace.
            b"HTTP/1.1 200 Fine Thanks\r\nX-Upstream-Thing: Yes\r\nx-ratelimit-limit: 5\r\nX-REQUEST-ID: from-the-upstream\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n[]".to_vec(),
            Duration::ZERO,
        )
    })
}

/// An upstream that writes `answer(head)` for each request head it reads (given as the bytes
/// that arrived), waits as long as that says, then closes the connection; it hands back each
/// head too.
fn scripted_upstream(
    answer: fn(&str) -> (Vec<u8>, Duration),
) -> (std::net::SocketAddr, std::sync::mpsc::Receiver<String>) {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (heads, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let heads = heads.clone();
            std::thread::spawn(move || {
                let Some(head) = common::read_request_head(&mut stream) else {
                    return;
                };
                let head = String::from_utf8_lossy(&head).into_owned();
                let (bytes, hold) = answer(&head);
                let _ = heads.send(head);
                let _ = stream.write_all(&bytes);
                std::thread::sleep(hold);
            });
        }
    });
    (addr, received)
}

/// The gateway keeps idle upstream connections and sends later requests on them, from any
/// client connection served by the same thread: a client's requests, one after another, and
/// then another client's, all reach the upstream on one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_upstream_connections_are_kept_for_later_requests_of_any_client() {
    let dir = tempfile::tempdir().unwrap();
    let orders = TestUpstream::start(Duration::ZERO).await;
    let stack = Stack::start_with_text(
        dir.path(),
        &format!("threads = 1\n{}", orders_route(&orders, "")),
    );
    let key = stack.key(&["--plan", "pro"]);
    for client_connection in 0..3 {
        // A client of its own, so a connection of its own.
        let c = client();
        for i in 0..5 {
            let r = c
                .get(stack.url(&format!("/v1/store/orders/{client_connection}-{i}")))
                .bearer_auth(&key)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    }
    assert_eq!(orders.hits(), 15);
    assert_eq!(
        orders.connections(),
        1,
        "every request on the one kept connection"
    );
    let opened = format!(
        "gateway_upstream_connections_total{{instance=\"{}\",route=\"/v1/store/orders\"}}",
        orders.addr
    );
    assert_eq!(metric(stack.admin, &opened), Some(1.0), "{opened}");
}

/// `HEAD` is proxied as a `GET` without its body: the head says the length the `GET`'s body has,
/// no body follows it, and both connections serve the next requests, the client's (the next
/// response starts right after the head) and the upstream's (kept, all four on one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_is_answered_without_a_body_and_both_connections_go_on() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let orders = TestUpstream::start(Duration::ZERO).await;
    let stack = Stack::start_with_text(
        dir.path(),
        &format!("threads = 1\n{}", orders_route(&orders, "")),
    );
    let key = stack.key(&["--plan", "pro"]);
    let listen = stack.listen;
    let heads = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(listen).unwrap();
        let mut answers = Vec::new();
        for method in ["HEAD", "GET", "HEAD", "GET"] {
            write!(
                s,
                "{method} /v1/store/orders/7 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n"
            )
            .unwrap();
            let head = read_head(&mut s);
            let body = if method == "GET" {
                read_body(&mut s, &head)
            } else {
                String::new()
            };
            answers.push((head, body));
        }
        answers
    })
    .await
    .unwrap();
    let length = |head: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .map(str::to_owned)
    };
    for (i, (head, body)) in heads.iter().enumerate() {
        assert!(head.starts_with("HTTP/1.1 200 "), "response {i}: {head}");
        assert!(head.contains("X-RateLimit-Limit: 300\r\n"), "{head}");
        if i % 2 == 1 {
            assert!(body.contains("/v1/store/orders/7"), "{body}");
            assert_eq!(length(head), Some(body.len().to_string()), "{head}");
            assert_eq!(length(&heads[i - 1].0), length(head), "the HEAD's length");
        }
    }
    assert_eq!(orders.hits(), 4);
    assert_eq!(
        orders.connections(),
        1,
        "the upstream connection kept after each HEAD"
    );
}

/// A kept upstream connection that the upstream closes while it is idle is not sent the next
/// request, which goes on a new connection and is answered: even a POST, which the gateway never
/// sends twice, so it would have been a 502 had it gone on the closed connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_upstream_connection_the_upstream_closed_is_not_used() {
    let dir = tempfile::tempdir().unwrap();
    // Answers one request a connection, with keep-alive, then closes it.
    let (upstream, heads) = scripted_upstream(|_| {
        let answer =
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n[]";
        (answer.as_bytes().to_vec(), Duration::ZERO)
    });
    let stack = Stack::start_with_text(
        dir.path(),
        &format!(
            "threads = 1\n{PETS_ROUTE}\n[[gateway.routes]]\nprefix = \"/v1/store\"\nupstream = \"{upstream}\"\n"
        ),
    );
    let key = stack.key(&["--plan", "pro"]);
    let c = client();
    for (i, method) in ["GET", "POST", "POST", "GET"].into_iter().enumerate() {
        let r = c
            .request(method.parse().unwrap(), stack.url("/v1/store/orders"))
            .bearer_auth(&key)
            .header("Content-Length", "0")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "request {i}, a {method}");
        assert_eq!(r.text().await.unwrap(), "[]");
        // Each answered on a connection of its own, which the upstream has closed meanwhile.
        let head = heads.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(
            head.starts_with(&format!("{method} /v1/store/orders ")),
            "{head}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(heads.try_recv().is_err(), "no request was sent twice");
    let opened = format!(
        "gateway_upstream_connections_total{{instance=\"{upstream}\",route=\"/v1/store\"}}"
    );
    assert_eq!(
        metric(stack.admin, &opened),
        Some(4.0),
        "{opened}: a connection of its own for each request"
    );
}

/// An upstream whose response breaks off before its end: if none of it has reached the client
/// (its head with `Content-Length` waits for the body, and the body is short), the client gets
/// the contract's 502, or 504 if the upstream stalls instead, never an empty reply. Once some
/// of it has left, the connection closes with the response cut short, as the client can tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_the_upstream_breaks_off_before_the_client_has_any_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (upstream, _heads) = scripted_upstream(|head| {
        let path = head.split(' ').nth(1).unwrap_or_default();
        let json = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n";
        let (answer, hold) = match path {
            "/v1/store/cut" => (format!("{json}Content-Length: 10\r\n\r\n[1,"), 0),
            "/v1/store/stall" => (format!("{json}Content-Length: 10\r\n\r\n[1,"), 3000),
            "/v1/store/long-cut" => (
                format!(
                    "{json}Content-Length: 100000\r\n\r\n[{}",
                    "1,".repeat(10_000)
                ),
                0,
            ),
            "/v1/store/chunked-cut" => (
                format!("{json}Transfer-Encoding: chunked\r\n\r\n3\r\n[1,\r\n"),
                0,
            ),
            _ => (format!("{json}Content-Length: 2\r\n\r\n[]"), 0),
        };
        (answer.into_bytes(), Duration::from_millis(hold))
    });
    let stack = Stack::start_with_text(
        dir.path(),
        &format!(
            "{PETS_ROUTE}\n[[gateway.routes]]\nprefix = \"/v1/store\"\nupstream = \"{upstream}\"\ntimeout_ms = 1000\n"
        ),
    );
    let key = stack.key(&["--plan", "pro"]);
    let get = |path: &str, keep_alive: bool| {
        let connection = if keep_alive { "keep-alive" } else { "close" };
        format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nConnection: {connection}\r\n\r\n"
        )
    };

    for (path, status, code) in [
        ("/v1/store/cut", "502 Bad Gateway", "bad_gateway"),
        ("/v1/store/stall", "504 Gateway Timeout", "gateway_timeout"),
    ] {
        // Asked to keep the connection, the gateway answers and closes it all the same.
        let (answer, closed) = answer_and_close(stack.listen, &get(path, true));
        assert!(closed, "{path}: the connection is closed after the error");
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(
            head.starts_with(&format!("HTTP/1.1 {status}\r\n")),
            "{path}: {answer}"
        );
        for line in [
            "Content-Type: application/json",
            "Connection: close",
            "X-RateLimit-Limit: 300",
            "X-Request-Id: ",
        ] {
            assert!(head.contains(line), "{path}: {line} in {head}");
        }
        let body: Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["code"], code, "{path}");
        // Counted as the gateway's answer (once the request is logged, just after it is sent).
        wait_metric(
            stack.admin,
            &format!(
                r#"gateway_responses_total{{method="GET",outcome="{code}",route="/v1/store",status="{}"}}"#,
                &status[..3]
            ),
            Duration::from_secs(10),
            |v| v == 1.0,
        );
    }

    // pingora passes the failure on either at once or as a step of its own, which flushes what it
    // has (about one time in three here): every time, the client gets the 502.
    for _ in 0..20 {
        let (answer, _) = answer_and_close(stack.listen, &get("/v1/store/cut", true));
        assert!(
            answer.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
            "{answer}"
        );
    }

    // Some of it reached the client: it is cut short where it broke off, and its length says so.
    let (answer, closed) = answer_and_close(stack.listen, &get("/v1/store/long-cut", true));
    assert!(closed);
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer:.200}");
    assert!(
        answer.contains("Content-Length: 100000\r\n"),
        "{answer:.300}"
    );
    let (_, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(body.len() < 100_000, "{}", body.len());
    // A chunked response's head leaves at once; without its last chunk, it is incomplete.
    let (answer, closed) = answer_and_close(stack.listen, &get("/v1/store/chunked-cut", true));
    assert!(closed);
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(!answer.ends_with("0\r\n\r\n"), "{answer}");

    // On a connection whose first response was whole, the next one is taken back too.
    let (answer, closed) = answer_and_close(
        stack.listen,
        &(get("/v1/store/fine", true) + &get("/v1/store/cut", true)),
    );
    assert!(closed);
    let (first, second) = answer.split_once("\r\n\r\n[]").unwrap();
    assert!(first.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(
        second.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
        "{answer}"
    );
}

/// `gateway.header_case`: `preserve` writes header names as they came and the gateway's own as
/// documented; `lower` writes them all in lowercase, both ways, on proxied responses and the
/// gateway's own. Values and the reason phrase are the same either way. Each of the gateway's
/// headers is sent once, with its value: a client's or an upstream's of the same name, in any
/// case, is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_case_is_preserved_or_lowercase_as_configured() {
    for case in ["preserve", "lower"] {
        let dir = tempfile::tempdir().unwrap();
        let (upstream, heads) = raw_upstream();
        let stack = Stack::start_with_text(
            dir.path(),
            &format!(
                "header_case = \"{case}\"\n{PETS_ROUTE}\n[[gateway.routes]]\nprefix = \"/v1/store\"\nupstream = \"{upstream}\"\n"
            ),
        );
        let key = stack.key(&["--plan", "free"]);
        let request = format!(
            "GET /v1/store/inventory HTTP/1.1\r\nHost: x\r\nX-Client-Thing: 1\r\nx-api-plan: enterprise\r\nX-Request-Id: from-the-client\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
        );
        let answer = raw_answer(stack.listen, &request);
        let head = heads.recv_timeout(Duration::from_secs(10)).unwrap();
        let (upstream_sees, client_sees) = match case {
            "preserve" => (
                [
                    "X-Client-Thing: 1",
                    "X-Api-Key-Id: ",
                    "X-Api-Plan: free",
                    "X-Request-Id: ",
                    "X-Forwarded-For: 127.0.0.1",
                ],
                [
                    "X-Upstream-Thing: Yes",
                    "X-RateLimit-Limit: 60",
                    "X-RateLimit-Remaining: 59",
                    "RateLimit-Policy: ",
                    "X-Request-Id: ",
                ],
            ),
            _ => (
                [
                    "x-client-thing: 1",
                    "x-api-key-id: ",
                    "x-api-plan: free",
                    "x-request-id: ",
                    "x-forwarded-for: 127.0.0.1",
                ],
                [
                    "x-upstream-thing: Yes",
                    "x-ratelimit-limit: 60",
                    "x-ratelimit-remaining: 59",
                    "ratelimit-policy: ",
                    "x-request-id: ",
                ],
            ),
        };
        for line in upstream_sees {
            assert!(
                head.contains(line),
                "{case}: upstream lacks {line:?}:\n{head}"
            );
        }
        assert!(
            !head.to_ascii_lowercase().contains("authorization"),
            "{case}: {head}"
        );
        for name in [
            "x-api-plan",
            "x-request-id",
            "x-forwarded-for",
            "x-api-key-id",
        ] {
            assert_eq!(
                lines_named(&head, name),
                1,
                "{case}: {name} upstream:\n{head}"
            );
        }
        assert!(
            !head.contains("from-the-client") && !head.contains("enterprise"),
            "{head}"
        );
        assert!(
            answer.starts_with("HTTP/1.1 200 Fine Thanks\r\n"),
            "{case}: {answer}"
        );
        for line in client_sees {
            assert!(
                answer.contains(line),
                "{case}: response lacks {line:?}:\n{answer}"
            );
        }
        assert!(
            answer.contains("Content-Type: application/json"),
            "{case}: {answer}"
        );
        for name in ["x-ratelimit-limit", "x-request-id"] {
            assert_eq!(lines_named(&answer, name), 1, "{case}: {name}:\n{answer}");
        }
        assert!(!answer.contains("from-the-upstream"), "{answer}");

        // The gateway's own answer: the same names, the same case.
        let answer = raw_answer(
            stack.listen,
            "GET /v1/store/inventory HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        let (auth, limit) = match case {
            "preserve" => ("WWW-Authenticate: Bearer", "X-RateLimit-Limit: "),
            _ => ("www-authenticate: Bearer", "x-ratelimit-limit: "),
        };
        assert!(answer.starts_with("HTTP/1.1 401"), "{case}: {answer}");
        assert!(
            answer.contains(auth) && answer.contains(limit),
            "{case}: {answer}"
        );
    }
}

/// How many header lines of `head` are named `name`, in any case.
fn lines_named(head: &str, name: &str) -> usize {
    head.lines()
        .filter(|line| {
            line.split_once(':')
                .is_some_and(|(n, _)| n.eq_ignore_ascii_case(name))
        })
        .count()
}

/// The status codes of the responses in `answers`, in order.
fn statuses(answers: &str) -> Vec<&str> {
    answers
        .match_indices("HTTP/1.1 ")
        .map(|(at, _)| &answers[at + 9..at + 12])
        .collect()
}

/// The whole answer to `request` on a fresh connection, as text.
fn raw_answer(addr: std::net::SocketAddr, request: &str) -> String {
    answer_and_close(addr, request).0
}
