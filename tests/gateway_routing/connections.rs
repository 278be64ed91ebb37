//! Client connections over time: clients that go away, the header and keep-alive timeouts,
//! slow heads, silent connections and request bodies that stop arriving.

use super::*;

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
