//! Request bodies and pipelining: bodies over the limit, requests pipelined on one connection,
//! blank lines in a body, refused small bodies that keep their connection, `100 Continue`.

use super::*;

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
