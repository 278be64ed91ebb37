//! Upstream pools: a route with several instances, balanced round-robin, health-checked; one
//! instance down costs clients nothing, and `/readyz` says when a route has none left.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use common::{PETS_ROUTE, Stack, TestUpstream, client, metric};
use nix::sys::signal::{Signal, kill};

fn ready(stack: &Stack) -> u16 {
    common::raw_http(
        stack.admin,
        b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .0
}

fn wait_ready(stack: &Stack, want: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while ready(stack) != want {
        assert!(
            Instant::now() < deadline,
            "/readyz is not {want} after 10 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `gateway_keys` (`[gateway]` keys), then the pets route and `/v1/store/orders` over a pool of
/// `instances`.
fn pool_config(gateway_keys: &str, instances: &[SocketAddr]) -> String {
    let list: Vec<String> = instances.iter().map(|i| format!("\"{i}\"")).collect();
    format!(
        "{gateway_keys}\n{PETS_ROUTE}\n[[gateway.routes]]\nprefix = \"/v1/store/orders\"\nupstreams = [{}]\n",
        list.join(", ")
    )
}

/// An order fetched through the pool with `key`.
async fn get_order(c: &reqwest::Client, stack: &Stack, key: &str) -> reqwest::Response {
    c.get(stack.url("/v1/store/orders/1"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
}

/// An order created through the pool with `key`: a request that cannot safely be sent twice.
async fn post_order(c: &reqwest::Client, stack: &Stack, key: &str) -> reqwest::Response {
    c.post(stack.url("/v1/store/orders"))
        .bearer_auth(key)
        .json(&serde_json::json!({"pet_id": 1}))
        .send()
        .await
        .unwrap()
}

/// `gateway_upstream_retries_total` of the pool's `instance` for `error`.
fn retries(stack: &Stack, error: &str, instance: SocketAddr) -> Option<f64> {
    metric(
        stack.admin,
        &format!(
            "gateway_upstream_retries_total{{error=\"{error}\",instance=\"{instance}\",route=\"/v1/store/orders\"}}"
        ),
    )
}

/// The name of `gateway_upstream_healthy` for the pool's `instance`.
fn healthy(instance: SocketAddr) -> String {
    format!("gateway_upstream_healthy{{instance=\"{instance}\",route=\"/v1/store/orders\"}}")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_serves_every_request_with_an_instance_down_and_readyz_follows_its_health() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (
        TestUpstream::start(Duration::ZERO).await,
        TestUpstream::start(Duration::ZERO).await,
    );
    let stack = Stack::start_with_text(dir.path(), &pool_config("", &[a.addr, b.addr]));
    let key = stack.key(&["--plan", "business"]);
    let c = client();
    let get = || get_order(&c, &stack, &key);

    // Round-robin over both.
    for _ in 0..10 {
        assert_eq!(get().await.status(), 200);
    }
    assert_eq!((a.hits(), b.hits()), (5, 5), "balanced round-robin");
    assert_eq!(ready(&stack), 200);

    // One instance gone: every request is still served, by the other.
    a.stop().await;
    for i in 0..20 {
        assert_eq!(
            get().await.status(),
            200,
            "request {i} with one instance down"
        );
    }
    assert_eq!(b.hits(), 25);
    let healthy = healthy(a.addr);
    common::wait_metric(stack.admin, &healthy, Duration::from_secs(5), |v| v == 0.0);
    assert_eq!(ready(&stack), 200, "the route still has a healthy instance");

    // Both gone: not ready, and requests get 502.
    b.stop().await;
    wait_ready(&stack, 503);
    let r = get().await;
    common::assert_error(r, 502, "bad_gateway").await;
    // Its first attempt was refused and tried again on the other instance: counted, and not
    // one of pingora's warnings, which came once per such request under load.
    let retried: f64 = [a.addr, b.addr]
        .into_iter()
        .filter_map(|i| retries(&stack, "ConnectRefused", i))
        .sum();
    assert!(retried >= 1.0, "retries counted: {retried}");
    let log = stack.proc.log_text();
    assert!(!log.contains("Fail to proxy"), "{log}");

    // A reload with the same pool keeps what the health checks learned: the dead instances do
    // not come back as healthy, not even until the next check.
    kill(stack.proc.pid(), Signal::SIGHUP).unwrap();
    let reloaded = Instant::now();
    while !stack.proc.log_text().contains("configuration reloaded") {
        assert!(reloaded.elapsed() < Duration::from_secs(10), "no reload");
        assert_eq!(ready(&stack), 503);
        std::thread::sleep(Duration::from_millis(20));
    }
    for _ in 0..15 {
        assert_eq!(
            ready(&stack),
            503,
            "still no healthy instance after the reload"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // One back where it was: ready again, and served.
    let back = TestUpstream::start_at(a.addr).await;
    wait_ready(&stack, 200);
    assert_eq!(get().await.status(), 200);
    assert!(back.hits() >= 1);
    assert_eq!(metric(stack.admin, &healthy), Some(1.0));
}

/// A listener with a full accept queue: connections to it time out unanswered, as to a host
/// that is gone. Returned with the connections that fill its queue.
fn unanswering() -> (tokio::net::TcpListener, Vec<std::net::TcpStream>) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut queued = Vec::new();
    loop {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(s) => queued.push(s),
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
                return (listener, queued);
            }
        }
        assert!(queued.len() < 64, "the accept queue never filled");
    }
}

/// A connection to an instance that times out (a host gone, its packets unanswered) sent
/// nothing, so the request is tried once on another instance, as after a refusal; counted by
/// its error. Here both are gone, and the client gets 502 after the two attempts.
#[tokio::test(flavor = "multi_thread")]
async fn a_connection_that_times_out_is_tried_on_another_instance() {
    let dir = tempfile::tempdir().unwrap();
    let ((x, _x_queue), (y, _y_queue)) = (unanswering(), unanswering());
    let (x, y) = (x.local_addr().unwrap(), y.local_addr().unwrap());
    let stack = Stack::start_with_text(
        dir.path(),
        &pool_config("connect_timeout_ms = 300", &[x, y]),
    );
    wait_ready(&stack, 503);
    let key = stack.key(&["--plan", "business"]);
    let r = get_order(&client(), &stack, &key).await;
    common::assert_error(r, 502, "bad_gateway").await;
    let timed_out = |i| retries(&stack, "ConnectTimedout", i).unwrap_or(0.0);
    assert_eq!(
        timed_out(x) + timed_out(y),
        1.0,
        "tried once more, elsewhere"
    );
}

/// An instance that refuses a connection leaves the rotation at once, not at the next health
/// check, and stays out until a check passes again, even if it answers before that (passive
/// health). Checks here run once an hour until a reload makes them frequent, so only the
/// refusal can have taken it out, and only a check can bring it back.
#[tokio::test(flavor = "multi_thread")]
async fn an_instance_that_refuses_a_connection_gets_no_traffic_until_a_check_passes() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (
        TestUpstream::start(Duration::ZERO).await,
        TestUpstream::start(Duration::ZERO).await,
    );
    let config = |interval_ms: u64| {
        Stack::config_with_text(
            dir.path(),
            &pool_config(
                &format!("health_check_interval_ms = {interval_ms}"),
                &[a.addr, b.addr],
            ),
        )
    };
    let stack = Stack::start_with(dir.path(), &config(3_600_000));
    let key = stack.key(&["--plan", "business"]);
    let c = client();
    let get = || get_order(&c, &stack, &key);
    for _ in 0..2 {
        assert_eq!(get().await.status(), 200);
    }
    assert_eq!((a.hits(), b.hits()), (1, 1), "both in the rotation");

    // `a` goes away: the one request that meets its refusal is retried on `b`, and `a` gets no
    // more tries, so no more retries.
    a.stop().await;
    for i in 0..20 {
        assert_eq!(get().await.status(), 200, "request {i}");
    }
    assert_eq!(b.hits(), 21);
    assert_eq!(
        retries(&stack, "ConnectRefused", a.addr),
        Some(1.0),
        "one refusal, then out of the rotation"
    );
    let healthy = healthy(a.addr);
    assert_eq!(metric(stack.admin, &healthy), Some(0.0));
    assert_eq!(ready(&stack), 200, "`b` is still in the rotation");

    // `a` answers again, but no check has passed since its refusal: still no traffic.
    let back = TestUpstream::start_at(a.addr).await;
    for _ in 0..10 {
        assert_eq!(get().await.status(), 200);
    }
    assert_eq!(back.hits(), 0, "out of the rotation until a check passes");

    // Checks every 200 ms from a reload on: the next one passes and `a` is back.
    config(200);
    kill(stack.proc.pid(), Signal::SIGHUP).unwrap();
    common::wait_metric(stack.admin, &healthy, Duration::from_secs(5), |v| v == 1.0);
    for _ in 0..10 {
        assert_eq!(get().await.status(), 200);
    }
    assert_eq!(back.hits(), 5, "round-robin over both again");
}

/// An instance that takes each connection, reads a request's head and closes the connection
/// unanswered, as one going down with requests in flight. Returned with the count of heads read.
async fn closer() -> (SocketAddr, Arc<AtomicUsize>) {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = Arc::new(AtomicUsize::new(0));
    let counted = heads.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut stream = BufReader::new(stream);
                let mut line = String::new();
                loop {
                    line.clear();
                    match stream.read_line(&mut line).await {
                        // A health check's connection: no request.
                        Ok(0) | Err(_) => return,
                        Ok(_) if line == "\r\n" => break,
                        Ok(_) => {}
                    }
                }
                counted.fetch_add(1, SeqCst);
            });
        }
    });
    (addr, heads)
}

/// A new connection closed before a byte of the answer (an instance going down: its listener
/// closed with the connection queued) sends a GET to another instance, as a refusal does, and
/// the client sees no error.
#[tokio::test(flavor = "multi_thread")]
async fn a_get_whose_new_connection_is_closed_unanswered_is_served_by_another_instance() {
    let dir = tempfile::tempdir().unwrap();
    let (closing, closed) = closer().await;
    let good = TestUpstream::start(Duration::ZERO).await;
    let stack = Stack::start_with_text(dir.path(), &pool_config("", &[closing, good.addr]));
    let key = stack.key(&["--plan", "business"]);
    let c = client();
    for i in 0..6 {
        assert_eq!(
            get_order(&c, &stack, &key).await.status(),
            200,
            "request {i}"
        );
    }
    assert_eq!(
        good.hits(),
        6,
        "every request served by the instance that answers"
    );
    let sent = closed.load(SeqCst);
    assert!(sent >= 1, "round-robin sent some to the closing instance");
    let retried: f64 = ["ConnectionClosed", "ReadError"]
        .into_iter()
        .filter_map(|e| retries(&stack, e, closing))
        .sum();
    assert_eq!(retried, sent as f64, "each counted as tried again");
}

/// A request that cannot safely be sent twice (a POST) is not: the instance may have acted on
/// it. One that can is sent once more, not again and again.
#[tokio::test(flavor = "multi_thread")]
async fn a_post_is_not_sent_again_and_a_get_is_sent_again_once() {
    let dir = tempfile::tempdir().unwrap();
    let ((x, x_heads), (y, y_heads)) = (closer().await, closer().await);
    // Checks once an hour: only a failure can take an instance out of the rotation here.
    let stack = Stack::start_with_text(
        dir.path(),
        &pool_config("health_check_interval_ms = 3600000", &[x, y]),
    );
    let key = stack.key(&["--plan", "business"]);
    let c = client();
    let heads = || x_heads.load(SeqCst) + y_heads.load(SeqCst);
    let in_rotation = || {
        [x, y]
            .into_iter()
            .filter_map(|i| metric(stack.admin, &healthy(i)))
            .sum::<f64>()
    };
    assert_eq!(in_rotation(), 2.0);

    common::assert_error(post_order(&c, &stack, &key).await, 502, "bad_gateway").await;
    assert_eq!(heads(), 1, "the POST went to one instance only");
    assert_eq!(in_rotation(), 1.0, "and took it out of the rotation");

    common::assert_error(get_order(&c, &stack, &key).await, 502, "bad_gateway").await;
    assert_eq!(heads(), 3, "the GET went to both, once each");
    assert_eq!(in_rotation(), 0.0);
}

/// The README's way to take an instance away with no error, `POST`s included: out of
/// `upstreams`, a reload, then stopped. After the reload no request reaches it, so whatever it
/// does as it goes down (here: closes every connection unanswered) costs nothing.
#[tokio::test(flavor = "multi_thread")]
async fn an_instance_drained_by_a_reload_costs_no_post_as_it_goes_down() {
    let dir = tempfile::tempdir().unwrap();
    let (leaving, heads) = closer().await;
    let staying = TestUpstream::start(Duration::ZERO).await;
    let config =
        |instances: &[SocketAddr]| Stack::config_with_text(dir.path(), &pool_config("", instances));
    let stack = Stack::start_with(dir.path(), &config(&[leaving, staying.addr]));
    let key = stack.key(&["--plan", "business"]);
    assert_eq!(metric(stack.admin, &healthy(leaving)), Some(1.0));

    config(&[staying.addr]);
    kill(stack.proc.pid(), Signal::SIGHUP).unwrap();
    stack.proc.wait_log("configuration reloaded");
    let c = client();
    for i in 0..10 {
        assert_eq!(post_order(&c, &stack, &key).await.status(), 200, "POST {i}");
    }
    assert_eq!((heads.load(SeqCst), staying.hits()), (0, 10));
}
