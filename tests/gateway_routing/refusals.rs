//! What is refused before it reaches an upstream, and how: ambiguous paths, request lines with
//! a space or control character, ambiguous body framing, oversized heads, and refusals reaching
//! a client that writes its whole body first (what pingora's parser refuses: `parser_refusals`).

use super::*;

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
        "GET /v1/store/orders/6 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nConnection: close, X-Hop\r\nX-Hop: secret\r\nKeep-Alive: timeout=5\r\nProxy-Authorization: Basic eA==\r\nX-End-To-End: kept\r\nX_Api_Key_Id: 0000000000000001\r\nX_Api_Plan: enterprise\r\nX_Forwarded-For: 192.0.2.1\r\nX-Request_Id: forged\r\nX_Forwarded_Proto: https\r\nX_End_To_End: kept too\r\n\r\n"
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
        "x_forwarded_proto",
        "x-request_id",
    ] {
        assert!(seen.get(alias).is_none(), "{alias} was forwarded: {seen}");
    }
    assert_eq!(seen["x-api-key-id"], key_id(&key));
    assert_eq!(seen["x-forwarded-proto"], "http", "{seen}");
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

/// A head over the gateway's limits (more than 100 headers, or a target and headers over
/// `max_header_bytes` together) gets the contract's 400, as does one past pingora's own; one
/// within them is served.
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
    // The target counts too: a 20 KiB query is refused, naming the limit, before it reaches
    // an upstream.
    let long_target = |bytes: usize| {
        format!(
            "GET /v1/pets?status=available&x={} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n",
            "q".repeat(bytes)
        )
    };
    let (status, _, body) = raw_http(stack.listen, long_target(20 * 1024).as_bytes());
    assert_eq!(status, 400);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["code"], "invalid_request");
    assert!(
        body["message"].as_str().unwrap().contains("16384 bytes"),
        "{body}"
    );
    // Within the limits: served (the backend's own answer to a parameter it does not know).
    let (status, _, body) = raw_http(stack.listen, long_target(8 * 1024).as_bytes());
    assert_eq!(status, 400);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["code"],
        "invalid_parameter"
    );
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
