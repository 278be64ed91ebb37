//! Upstream connections and what goes over them: idle connections kept and reused, `HEAD`,
//! responses the upstream breaks off, and header case as configured.

use super::*;

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
/// case, is dropped (a client's `X-Forwarded-Proto: https` over plain HTTP among them).
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
            "GET /v1/store/inventory HTTP/1.1\r\nHost: x\r\nX-Client-Thing: 1\r\nx-api-plan: enterprise\r\nX-Request-Id: from-the-client\r\nX-Forwarded-Proto: https\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
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
                    "X-Forwarded-Proto: http\r\n",
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
                    "x-forwarded-proto: http\r\n",
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
            "x-forwarded-proto",
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
