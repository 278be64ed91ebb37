//! The listeners themselves: half-open connections, the limit on open files, the admin
//! listener's endpoints and timeouts, and shutdown.

use super::*;

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
    // The three paths are read-only: another method is told so, with what it may use, and the
    // connection (its body read and dropped) serves the next request.
    for path in ["/metrics", "/healthz", "/readyz"] {
        let r = c.post(admin(path)).body("reset=1").send().await.unwrap();
        assert_eq!(r.headers()["allow"], "GET, HEAD", "{path}");
        assert_error(r, 405, "method_not_allowed").await;
        let r = c.head(admin(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    assert_error(
        c.delete(admin("/nope")).send().await.unwrap(),
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
