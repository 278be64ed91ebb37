//! HTTPS connections: plain HTTP sent to the TLS port, slow heads and silent connections, and
//! HTTP/2 clients that go away with requests in flight.

use super::*;

/// Plain HTTP sent to the TLS port gets a TLS alert and a closed connection at once, not a wait.
#[test]
fn plain_http_sent_to_the_tls_port_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let (_stack, tls) = tls_stack(dir.path(), &cert, &key);
    let mut s = TcpStream::connect(tls).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = Instant::now();
    s.write_all(b"GET /v1/pets HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
        .expect("closed, not left hanging");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        answer.first(),
        Some(&0x15),
        "a TLS alert, then the connection closes"
    );
}

/// Over HTTPS/1.1 a connection is bounded as over plain HTTP: a request head trickled for longer
/// than `gateway.header_timeout_seconds` is closed, however steadily it comes, and a connection
/// silent after its handshake goes at the keep-alive timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_heads_and_silent_connections_over_https_are_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let config = dir.path().join("short-timeouts.toml");
    let shipped = std::fs::read_to_string(shipped_config()).unwrap();
    let short = shipped
        .replace(
            "keepalive_timeout_seconds = 60",
            "keepalive_timeout_seconds = 3",
        )
        .replace("header_timeout_seconds = 10", "header_timeout_seconds = 1");
    assert_ne!(short, shipped, "the shipped timeouts moved");
    std::fs::write(&config, short).unwrap();
    let (stack, tls) = Stack::start_tls(dir.path(), &config, &cert, &key);
    let api_key = stack.key(&["--plan", "pro"]);
    let silent = ca.connect_http1(tls).await;

    let mut slow = ca.connect_http1(tls).await;
    let head =
        format!("GET /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {api_key}\r\n\r\n");
    let closed_after = common::trickle_until_closed(&mut slow, head.as_bytes()).await;
    common::assert_closed_at_header_timeout(closed_after, stack.admin);
    let mut buf = [0u8; 256];

    // The same head sent at once is answered, and the connection stays open for more.
    let mut quick = ca.connect_http1(tls).await;
    for _ in 0..2 {
        quick.write_all(head.as_bytes()).await.unwrap();
        let n = quick.read(&mut buf).await.unwrap();
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&buf[..n])
        );
        let mut rest = vec![0u8; 4096];
        let _ = tokio::time::timeout(Duration::from_millis(200), quick.read(&mut rest)).await;
    }

    // The connection that sent nothing after its handshake goes at the keep-alive timeout.
    let admin = stack.admin;
    tokio::task::spawn_blocking(move || {
        wait_metric(
            admin,
            "gateway_client_timeouts_total{phase=\"idle\"}",
            Duration::from_secs(10),
            |v| v >= 1.0,
        )
    })
    .await
    .unwrap();
    let mut silent = silent;
    let read = tokio::time::timeout(Duration::from_secs(2), silent.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the silent connection is still open: {read:?}"
    );
}

/// HTTP/2 clients that go away with requests in flight, by cancelling their streams or by
/// closing the connection, are no failure: nothing is logged above debug and each request
/// counts as `client_closed`, as over HTTP/1.1 (`tests/gateway_routing/connections.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_that_go_away_mid_request_are_counted_not_logged() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let slow = common::TestUpstream::start(Duration::from_secs(1)).await;
    let routes = format!(
        "{}\n[[gateway.routes]]\nprefix = \"/v1/store/orders\"\nupstream = \"{}\"\ntimeout_ms = 10000\n",
        common::PETS_ROUTE,
        slow.addr
    );
    let config = Stack::config_with_text(dir.path(), &routes);
    let (stack, tls) = Stack::start_tls(dir.path(), &config, &cert, &key);
    let api_key = stack.key(&["--plan", "pro"]);

    // Two connections with five requests each: the first cancels its streams, the second is
    // closed with its streams open.
    for close_connection in [false, true] {
        let stream = ca.connect(tls, b"h2").await;
        let (mut send, connection) = h2::client::handshake(stream).await.unwrap();
        let driver = tokio::spawn(connection);
        let mut pending = Vec::new();
        for _ in 0..5 {
            let request = http::Request::get(format!(
                "https://localhost:{}/v1/store/orders/1",
                tls.port()
            ))
            .header("authorization", format!("Bearer {api_key}"))
            .body(())
            .unwrap();
            send = send.ready().await.unwrap();
            let (response, _) = send.send_request(request, true).unwrap();
            pending.push(response);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        if close_connection {
            driver.abort();
        }
        drop(pending);
        tokio::time::sleep(Duration::from_millis(100)).await;
        driver.abort();
    }
    common::wait_client_closed(stack.admin, "/v1/store/orders", 10.0).await;
    let log = stack.proc.log_text();
    assert!(!log.contains(" WARN ") && !log.contains(" ERROR "), "{log}");
}

/// An HTTP/2 client that cancels its stream while the upstream is still working is let go at
/// once, as an HTTP/1.1 client that closes its connection is (`tests/gateway_routing/connections.rs`): the
/// gateway reads the stream's reset while it waits for the upstream and closes the upstream
/// connection without waiting for an answer or the route's 30 s timeout; the client's
/// connection goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_cancelled_while_the_upstream_works_is_let_go_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let (upstream, head_read, seen) = common::silent_upstream();
    let routes = format!(
        "{}\n[[gateway.routes]]\nprefix = \"/v1/store\"\nupstream = \"{upstream}\"\ntimeout_ms = 30000\n",
        common::PETS_ROUTE,
    );
    let config = Stack::config_with_text(dir.path(), &routes);
    let (stack, tls) = Stack::start_tls(dir.path(), &config, &cert, &key);
    let api_key = stack.key(&["--plan", "pro"]);

    let stream = ca.connect(tls, b"h2").await;
    let (send, connection) = h2::client::handshake(stream).await.unwrap();
    let driver = tokio::spawn(connection);
    let get = |path: &str| {
        http::Request::get(format!("https://localhost:{}{path}", tls.port()))
            .header("authorization", format!("Bearer {api_key}"))
            .body(())
            .unwrap()
    };
    let mut send = send.ready().await.unwrap();
    let (response, _) = send.send_request(get("/v1/store/orders"), true).unwrap();
    tokio::task::spawn_blocking(move || head_read.recv_timeout(Duration::from_secs(10)))
        .await
        .unwrap()
        .unwrap();
    drop(response);
    let seen = tokio::task::spawn_blocking(move || seen.recv_timeout(Duration::from_secs(15)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen, "closed");
    common::wait_client_closed(stack.admin, "/v1/store", 1.0).await;

    // The connection serves the next request.
    let mut send = send.ready().await.unwrap();
    let (response, _) = send.send_request(get("/v1/pets"), true).unwrap();
    assert_eq!(response.await.unwrap().status(), 200);
    driver.abort();
}
