//! SIGHUP re-reads the configuration in a running gateway: a good file is swapped in whole
//! without dropping a connection or a count; a bad one changes nothing and is logged.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{PETS_ROUTE, Stack, TestUpstream, metric};
use nix::sys::signal::{Signal, kill};

fn config(pro_per_minute: u32, extra: &str) -> String {
    format!(
        "[gateway]\nkey_refresh_ms = 200\n[gateway.plans.pro]\nper_minute = {pro_per_minute}\nper_day = 10000\n{PETS_ROUTE}\n{extra}"
    )
}

/// One request on an open connection; returns the whole answer's head.
fn request(s: &mut TcpStream, path: &str, key: &str) -> String {
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n"
    )
    .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the connection was closed");
        answer.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&answer);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if body.len() >= length {
                return head.to_owned();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_swaps_in_a_good_configuration_and_refuses_a_bad_one_whole() {
    let dir = tempfile::tempdir().unwrap();
    let orders = TestUpstream::start(Duration::ZERO).await;
    let path = dir.path().join("live.toml");
    std::fs::write(&path, config(300, "")).unwrap();
    let stack = Stack::start_with(dir.path(), &path);
    let key = stack.key(&["--plan", "pro"]);
    let mut conn = TcpStream::connect(stack.listen).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let head = request(&mut conn, "/v1/pets", &key);
    assert!(
        head.contains("x-ratelimit-limit: 300") || head.contains("X-RateLimit-Limit: 300"),
        "{head}"
    );
    request(&mut conn, "/v1/pets", &key);

    // A new limit for the plan and a new route, then SIGHUP.
    let route = format!(
        "[[gateway.routes]]\nprefix = \"/v1/store/orders\"\nupstream = \"{}\"\n",
        orders.addr
    );
    std::fs::write(&path, config(5, &route)).unwrap();
    kill(stack.proc.pid(), Signal::SIGHUP).unwrap();
    stack.proc.wait_log("configuration reloaded");
    // The same connection, still open: the new limit applies, and the two counted requests
    // are still counted.
    let head = request(&mut conn, "/v1/pets", &key).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("x-ratelimit-limit: 5\r\n"), "{head}");
    assert!(head.contains("x-ratelimit-remaining: 2\r\n"), "{head}");
    let head = request(&mut conn, "/v1/store/orders/7", &key).to_ascii_lowercase();
    assert!(
        head.starts_with("http/1.1 200"),
        "the new route answers: {head}"
    );
    assert_eq!(orders.hits(), 1);

    // A file with an error: refused whole, logged with the line, counted; nothing changes.
    std::fs::write(
        &path,
        config(1000, "[gateway.bans]\nthreshold = \"many\"\n"),
    )
    .unwrap();
    kill(stack.proc.pid(), Signal::SIGHUP).unwrap();
    stack.proc.wait_log("the configuration was refused");
    assert!(
        stack.proc.log_text().contains("line "),
        "the log says where"
    );
    assert_eq!(
        metric(stack.admin, "gateway_reloads_total{result=\"error\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(stack.admin, "gateway_reloads_total{result=\"ok\"}"),
        Some(1.0)
    );
    // Still the limit of 5 (the refused file said 1000), and the orders request counted too.
    let head = request(&mut conn, "/v1/pets", &key).to_ascii_lowercase();
    assert!(
        head.contains("x-ratelimit-limit: 5\r\n") && head.contains("x-ratelimit-remaining: 0\r\n"),
        "{head}"
    );
}

/// A keep-alive timeout shortened by a reload applies to connections already open: their next
/// wait ends at the new timeout, not at the old one their idle alarm was set for.
#[test]
fn a_shortened_keepalive_timeout_applies_to_open_connections() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live.toml");
    let with_keepalive =
        |seconds: u32| format!("[gateway]\nkeepalive_timeout_seconds = {seconds}\n{PETS_ROUTE}");
    std::fs::write(&path, with_keepalive(60)).unwrap();
    let stack = Stack::start_with(dir.path(), &path);
    let key = stack.key(&["--plan", "pro"]);
    let mut conn = TcpStream::connect(stack.listen).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert!(request(&mut conn, "/v1/pets", &key).starts_with("HTTP/1.1 200"));

    std::fs::write(&path, with_keepalive(1)).unwrap();
    kill(stack.proc.pid(), Signal::SIGHUP).unwrap();
    stack.proc.wait_log("configuration reloaded");
    assert!(request(&mut conn, "/v1/pets", &key).starts_with("HTTP/1.1 200"));
    // Idle from here: closed after about a second, well before the old 60 s (or the 10 s this
    // read waits).
    let idle = std::time::Instant::now();
    assert_eq!(
        conn.read(&mut [0u8; 64]).unwrap(),
        0,
        "closed by the gateway"
    );
    assert!(
        idle.elapsed() < Duration::from_secs(5),
        "{:?}",
        idle.elapsed()
    );
}
