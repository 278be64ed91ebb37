//! Several gateways, one Redis: real `animal-store gateway` processes over one backend and a
//! real `redis-server` (or a three-master cluster), all on ephemeral loopback ports.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::redis::{RedisCluster, RedisServer};
use common::{
    Backend, GatewayOnly, PETS_ROUTE, assert_error, cli, client, free_addr, key_id, metric,
    wait_metric,
};
use nix::sys::signal::{Signal, kill};

/// A configuration like the shipped one, with a quick key refresh and `extra` gateway keys.
fn config(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("scale-out.toml");
    std::fs::write(
        &path,
        format!("[gateway]\nkey_refresh_ms = 200\nthreads = 1\n{extra}\n{PETS_ROUTE}"),
    )
    .unwrap();
    path
}

/// `keys ARGS --redis-url URL`, from a data directory no gateway uses: keys live in Redis.
fn keys(dir: &Path, config: &Path, url: &str, args: &[&str]) -> String {
    let cli_dir = dir.join("cli-data");
    let mut all = vec!["keys"];
    all.extend_from_slice(args);
    all.extend_from_slice(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        cli_dir.to_str().unwrap(),
        "--redis-url",
        url,
    ]);
    let (code, stdout, stderr) = cli(&all);
    assert_eq!(code, 0, "keys {args:?} failed: {stderr}");
    stdout.trim().to_owned()
}

/// An enterprise key of `per_minute` and 100,000 a day.
fn enterprise(dir: &Path, config: &Path, url: &str, per_minute: u64) -> String {
    enterprise_day(dir, config, url, per_minute, 100_000)
}

/// An enterprise key of `per_minute` and `per_day`.
fn enterprise_day(dir: &Path, config: &Path, url: &str, per_minute: u64, per_day: u64) -> String {
    let (m, d) = (per_minute.to_string(), per_day.to_string());
    keys(
        dir,
        config,
        url,
        &[
            "create",
            "--plan",
            "enterprise",
            "--per-minute",
            &m,
            "--per-day",
            &d,
        ],
    )
}

/// Sends `n` concurrent GETs with `key`, alternating between the gateways; returns the
/// statuses.
async fn burst(gateways: &[&GatewayOnly], key: &str, n: usize) -> Vec<u16> {
    let c = client();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (c, url, key) = (
                c.clone(),
                gateways[i % gateways.len()].url("/v1/pets"),
                key.to_owned(),
            );
            tokio::spawn(async move {
                let r = c.get(url).bearer_auth(key).send().await.unwrap();
                r.status().as_u16()
            })
        })
        .collect();
    let mut statuses = Vec::with_capacity(n);
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    statuses
}

/// One backend and two gateways with data directories of their own, gateway `a` given
/// `url_a` and gateway `b` given `url_b` as `--redis-url`.
struct Fleet {
    config: PathBuf,
    a: GatewayOnly,
    b: GatewayOnly,
    _backend: Backend,
}

/// Their Redis timeout is generous: these tests are about exactness, and two debug-built
/// gateways under a burst on a loaded two-core machine can take longer than the default 50 ms,
/// which would (rightly) put them in fallback.
fn fleet(dir: &Path, url_a: &str, url_b: &str) -> Fleet {
    let config = config(dir, "[gateway.redis]\ntimeout_ms = 5000");
    let backend = Backend::start(&dir.join("backend-data"));
    let a = GatewayOnly::start(dir, "a", &config, backend.addr, &["--redis-url", url_a]);
    let b = GatewayOnly::start(dir, "b", &config, backend.addr, &["--redis-url", url_b]);
    Fleet {
        config,
        a,
        b,
        _backend: backend,
    }
}

/// A response's `Retry-After`, in seconds.
fn retry_after(r: &reqwest::Response) -> u64 {
    r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

/// Waits until each of `gateways` counts `n` gateways sharing Redis.
fn wait_gateways(gateways: &[&GatewayOnly], n: usize) {
    for g in gateways {
        wait_metric(
            g.admin,
            "gateway_limit_store_gateways",
            Duration::from_secs(10),
            |v| v == n as f64,
        );
    }
}

/// What each gateway's limit store went through, for a failure's message: its metrics and the
/// lines its log wrote about Redis.
fn fleet_report(gateways: &[&GatewayOnly]) -> String {
    let mut report = String::new();
    for g in gateways {
        report.push_str(&format!("gateway at {}:\n", g.listen));
        for name in [
            "gateway_limit_store_up",
            "gateway_limit_store_gateways",
            "gateway_limit_store_fallbacks_total",
            "gateway_limit_store_outages_total",
        ] {
            report.push_str(&format!("  {name} {:?}\n", metric(g.admin, name)));
        }
        for line in g.proc.log_text().lines().filter(|l| l.contains("redis")) {
            report.push_str(&format!("  | {line}\n"));
        }
    }
    report
}

/// The clients `redis` has, but for the redis-cli asking.
fn redis_clients(redis: &RedisServer) -> Vec<String> {
    redis
        .cli(&["client", "list"])
        .lines()
        .filter(|l| !l.contains("cmd=client|list"))
        .map(str::to_owned)
        .collect()
}

/// One gateway (one proxy thread) on `redis` over a backend of its own, and a key it knows whose
/// limit no test reaches.
fn lone_gateway(dir: &Path, redis: &RedisServer) -> (GatewayOnly, String, Backend) {
    let url = redis.url();
    let config = config(dir, "[gateway.redis]\ntimeout_ms = 5000");
    let backend = Backend::start(&dir.join("backend-data"));
    let gateway = GatewayOnly::start(dir, "a", &config, backend.addr, &["--redis-url", &url]);
    let key = enterprise(dir, &config, &url, 100_000);
    gateway.wait_keys(1);
    (gateway, key, backend)
}

/// Sends requests with `key` until the one-thread `gateway` has a Redis connection of the
/// thread's own beside the shared one: the first decisions go over the shared connection while
/// the thread's own is made.
async fn until_the_thread_has_its_own_connection(
    redis: &RedisServer,
    gateway: &GatewayOnly,
    key: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis_clients(redis).len() < 2 {
        assert!(
            Instant::now() < deadline,
            "no connection of the thread's own: {:?}",
            redis_clients(redis)
        );
        let statuses = burst(&[gateway], key, 20).await;
        assert_eq!(count(&statuses, 200), 20);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `gateway` says its limits are (`up`) or are not decided in Redis.
fn wait_store_up(gateway: &GatewayOnly, up: bool, within: Duration) {
    let want = if up { 1.0 } else { 0.0 };
    wait_metric(gateway.admin, "gateway_limit_store_up", within, |v| {
        v == want
    });
}

/// Every decision of `gateways` so far was made in Redis, not by a fallback.
fn assert_all_decided_in_redis(gateways: &[&GatewayOnly]) {
    for g in gateways {
        assert_eq!(
            metric(g.admin, "gateway_limit_store_fallbacks_total"),
            Some(0.0),
            "a gateway fell back: redis was slower than timeout_ms or away"
        );
    }
}

/// Two gateways with separate data directories over one Redis: they share keys, never admit
/// more than a key's limit between them, and a ban made at one holds at the other.
#[tokio::test(flavor = "multi_thread")]
async fn two_gateways_share_keys_limits_and_bans_through_redis() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start();
    let url = redis.url();
    let Fleet {
        config,
        a,
        b,
        _backend,
    } = fleet(dir.path(), &url, &url);

    // A key made from a third data directory is used by both gateways.
    let key = enterprise(dir.path(), &config, &url, 100);
    a.wait_keys(1);
    b.wait_keys(1);
    let statuses = burst(&[&a, &b], &key, 300).await;
    assert_all_decided_in_redis(&[&a, &b]);
    assert_eq!(
        count(&statuses, 200),
        100,
        "admitted between both: {statuses:?}"
    );
    assert_eq!(count(&statuses, 429), 200);
    assert_eq!(
        metric(a.admin, "gateway_limiter_keys"),
        None,
        "no embedded store's table to show"
    );
    assert!(!a.data_dir.join("keys.json").exists(), "keys live in redis");
    let stored = redis.cli(&["hgetall", "as:{keys}"]);
    assert!(
        stored.contains(key_id(&key)) && !stored.contains(&key),
        "hashes only in redis"
    );

    // A ban made at one gateway holds at the other at once.
    let banned = enterprise(dir.path(), &config, &url, 1);
    a.wait_keys(2);
    b.wait_keys(2);
    let c = client();
    let get = |g: &GatewayOnly| c.get(g.url("/v1/pets")).bearer_auth(&banned).send();
    assert_eq!(get(&a).await.unwrap().status(), 200);
    for _ in 0..10 {
        assert_eq!(get(&a).await.unwrap().status(), 429);
    }
    assert_error(get(&a).await.unwrap(), 429, "key_banned").await;
    let r = get(&b).await.unwrap();
    let retry = retry_after(&r);
    assert!((895..=900).contains(&retry), "Retry-After {retry}");
    assert_error(r, 429, "key_banned").await;

    // Revoked from anywhere, refused everywhere within 2 seconds (refresh every 200 ms here;
    // 3 s allows for a loaded machine).
    keys(dir.path(), &config, &url, &["revoke", key_id(&key)]);
    let revoked_at = Instant::now();
    for g in [&a, &b] {
        while c
            .get(g.url("/v1/pets"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .status()
            != 401
        {
            assert!(
                revoked_at.elapsed() < Duration::from_secs(3),
                "still accepted"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let list = keys(dir.path(), &config, &url, &["list"]);
    assert_eq!(list.lines().count(), 2, "{list}");
    assert!(list.contains(&format!("{}\t", key_id(&key))) && !list.contains(&key));
}

/// `gateway.redis.timeout_ms` is how long a decision may wait for Redis: a Redis busy for 3 s
/// (`DEBUG SLEEP`) under a 5 s timeout still decides, and nothing falls back.
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_redis_within_timeout_ms_still_decides() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let url = redis.url();
    let Fleet {
        config,
        a,
        b: _b,
        _backend,
    } = fleet(dir.path(), &url, &url);
    let key = enterprise(dir.path(), &config, &url, 1_000);
    a.wait_keys(1);
    wait_store_up(&a, true, Duration::from_secs(5));
    assert_eq!(burst(&[&a], &key, 1).await, [200]);

    let sleeper = {
        let port = redis.addr.port().to_string();
        std::thread::spawn(move || {
            std::process::Command::new("redis-cli")
                .args(["-h", "127.0.0.1", "-p", &port, "DEBUG", "SLEEP", "3"])
                .output()
                .unwrap()
        })
    };
    std::thread::sleep(Duration::from_millis(300)); // Redis is asleep
    let started = Instant::now();
    assert_eq!(burst(&[&a], &key, 1).await, [200]);
    assert!(
        started.elapsed() > Duration::from_secs(2),
        "it waited for Redis"
    );
    sleeper.join().unwrap();
    assert_all_decided_in_redis(&[&a]);
    assert_eq!(
        metric(a.admin, "gateway_limit_store_outages_total"),
        Some(0.0)
    );
}

/// Each gateway counts the gateways sharing Redis (what an outage divides limits by) in
/// `/metrics`; one that stops takes itself out of the live set as it exits, rather than being
/// counted until its last heartbeat is 5 s old.
#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_that_stops_leaves_the_count_of_gateways_sharing_redis() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start();
    let url = redis.url();
    let Fleet { a, b: mut gone, .. } = fleet(dir.path(), &url, &url);
    wait_gateways(&[&a, &gone], 2);
    assert_eq!(gone.proc.terminate(), Some(0));
    assert_eq!(
        redis.cli(&["ZCARD", "as:gateways"]).trim(),
        "1",
        "left as it exited"
    );
    wait_gateways(&[&a], 1);
}

/// Redis killed under load: each gateway limits with its share and says so in `/metrics`;
/// Redis back: limits are exact and shared again, with no restart.
#[tokio::test(flavor = "multi_thread")]
async fn a_redis_outage_falls_back_to_shares_and_its_return_restores_exact_limits() {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = RedisServer::start();
    let url = redis.url();
    let Fleet {
        config,
        a,
        b,
        _backend,
    } = fleet(dir.path(), &url, &url);
    let busy = enterprise(dir.path(), &config, &url, 100_000);
    let shared = enterprise(dir.path(), &config, &url, 20);
    a.wait_keys(2);
    b.wait_keys(2);
    for g in [&a, &b] {
        wait_store_up(g, true, Duration::from_secs(5));
    }
    wait_gateways(&[&a, &b], 2); // each divides by 2 in the outage

    // A load across both gateways, with Redis killed in its middle.
    let load = {
        let (a, b, busy) = (a.url("/v1/pets"), b.url("/v1/pets"), busy.clone());
        tokio::spawn(async move {
            let c = client();
            let mut statuses = Vec::new();
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(3) {
                for url in [&a, &b] {
                    statuses.push(c.get(url).bearer_auth(&busy).send().await.unwrap().status());
                }
            }
            statuses
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    redis.kill();
    let statuses = load.await.unwrap();
    assert!(
        statuses.iter().all(|s| *s == 200),
        "every request of the load was served: {:?}",
        statuses.iter().filter(|s| **s != 200).collect::<Vec<_>>()
    );
    for g in [&a, &b] {
        assert_eq!(metric(g.admin, "gateway_limit_store_up"), Some(0.0));
        assert!(metric(g.admin, "gateway_limit_store_fallbacks_total").unwrap() > 0.0);
        assert_eq!(
            metric(g.admin, "gateway_limit_store_outages_total"),
            Some(1.0)
        );
    }
    let log = std::fs::read_to_string(&a.proc.log).unwrap();
    assert_eq!(
        log.matches("fallback `local`: limiting alone with 1/2 of each limit (2 gateways alive)")
            .count(),
        1,
        "logged once"
    );

    // Alone, gateway A admits its share: 20 a minute between two gateways is 10 here.
    let statuses = burst(&[&a], &shared, 30).await;
    assert_eq!(count(&statuses, 200), 10, "{statuses:?}");

    // Redis returns (with its append-only file): both gateways go back to it by themselves.
    redis.restart();
    for g in [&a, &b] {
        wait_store_up(g, true, Duration::from_secs(10));
    }
    let fresh = enterprise(dir.path(), &config, &url, 40);
    a.wait_keys(3);
    b.wait_keys(3);
    let statuses = burst(&[&a, &b], &fresh, 120).await;
    assert_eq!(
        count(&statuses, 200),
        40,
        "exact again: {statuses:?}\n{}",
        fleet_report(&[&a, &b])
    );
}

/// Started while Redis is away, the gateway runs (no hang, no crash); with `fallback = deny`
/// it answers 503 while Redis cannot decide, and uses Redis as soon as it is there.
#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_started_without_redis_runs_and_deny_answers_503() {
    let dir = tempfile::tempdir().unwrap();
    let redis_addr: SocketAddr = free_addr();
    let url = format!("redis://{redis_addr}");
    let config = config(
        dir.path(),
        "[gateway.redis]\nfallback = \"deny\"\ntimeout_ms = 100",
    );
    let backend = Backend::start(&dir.path().join("backend-data"));
    let started = Instant::now();
    let g = GatewayOnly::start(
        dir.path(),
        "g",
        &config,
        backend.addr,
        &["--redis-url", &url],
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "start did not wait for redis"
    );
    assert_eq!(metric(g.admin, "gateway_limit_store_up"), Some(0.0));
    let log = std::fs::read_to_string(&g.proc.log).unwrap();
    assert!(
        log.contains("unreachable"),
        "the log says redis is away: {log}"
    );

    let mut redis = RedisServer::start_at(redis_addr, &[]);
    let key = enterprise(dir.path(), &config, &url, 1000);
    g.wait_keys(1);
    wait_store_up(&g, true, Duration::from_secs(10));
    let c = client();
    assert_eq!(
        c.get(g.url("/v1/pets"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    redis.kill();
    let r = c
        .get(g.url("/v1/pets"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["retry-after"], "1");
    assert_error(r, 503, "unavailable").await;
    // The keys it knew stay known while Redis is away.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(metric(g.admin, "gateway_active_keys"), Some(1.0));
    assert!(metric(g.admin, "gateway_key_reload_failures").unwrap() > 0.0);
}

/// Two gateways over a three-master Redis Cluster, one given one node and the other all three:
/// the same exactness as over one server.
#[tokio::test(flavor = "multi_thread")]
async fn two_gateways_on_a_redis_cluster_admit_exactly_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = RedisCluster::start();
    let all: Vec<String> = cluster.nodes.iter().map(|n| n.url()).collect();
    let all = all.join(",");
    let one = cluster.url();
    let Fleet {
        config,
        a,
        b,
        _backend,
    } = fleet(dir.path(), &one, &all);
    let mut keys_made = Vec::new();
    for i in 0..3 {
        keys_made.push(enterprise(dir.path(), &config, &one, 60));
        a.wait_keys(i + 1);
        b.wait_keys(i + 1);
    }
    for key in &keys_made {
        let statuses = burst(&[&a, &b], key, 150).await;
        assert_all_decided_in_redis(&[&a, &b]);
        assert_eq!(count(&statuses, 200), 60, "{statuses:?}");
    }
    let log = std::fs::read_to_string(&a.proc.log).unwrap();
    assert!(log.contains("connected to the cluster"), "{log}");
}

/// Limit decisions go over a Redis connection of the proxy thread's own, not the shared one
/// whose I/O runs on another thread: one more connection per proxy thread (here one), made
/// once and kept, not one per request.
#[tokio::test(flavor = "multi_thread")]
async fn the_proxy_thread_decides_over_its_own_redis_connection() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start();
    let (gateway, key, _backend) = lone_gateway(dir.path(), &redis);
    assert_eq!(
        redis_clients(&redis).len(),
        1,
        "the shared connection: {:?}",
        redis_clients(&redis)
    );

    until_the_thread_has_its_own_connection(&redis, &gateway, &key).await;
    let statuses = burst(&[&gateway], &key, 300).await;
    assert_eq!(count(&statuses, 200), 300);
    assert_all_decided_in_redis(&[&gateway]);
    let now = redis_clients(&redis);
    assert_eq!(now.len(), 2, "one per proxy thread, kept: {now:?}");
    assert!(
        now.iter().any(|l| l.contains("cmd=evalsha")),
        "decisions are made over it: {now:?}"
    );
}

/// Redis restarted while no request comes: the heartbeat notices both the outage and the
/// return, and the proxy thread's own connection, which saw neither, is not the first request's
/// way back (it would fail, count a second outage, and decide alone until the next heartbeat).
#[tokio::test(flavor = "multi_thread")]
async fn after_redis_returns_to_an_idle_gateway_the_first_decisions_are_made_in_redis() {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = RedisServer::start();
    let (gateway, key, _backend) = lone_gateway(dir.path(), &redis);
    until_the_thread_has_its_own_connection(&redis, &gateway, &key).await;
    assert_all_decided_in_redis(&[&gateway]);

    redis.kill();
    wait_store_up(&gateway, false, Duration::from_secs(5));
    redis.restart();
    wait_store_up(&gateway, true, Duration::from_secs(10));
    gateway.wait_keys(1);

    let statuses = burst(&[&gateway], &key, 50).await;
    assert_eq!(count(&statuses, 200), 50);
    assert_all_decided_in_redis(&[&gateway]);
    assert_eq!(
        metric(gateway.admin, "gateway_limit_store_outages_total"),
        Some(1.0),
        "{}",
        fleet_report(&[&gateway])
    );
}

/// While a gateway decides alone, a key starts from where Redis last said it stands: an outage
/// neither lifts a ban nor gives a spent minute or day a fresh share, and a key with part of its
/// minute or day left gets that part (all of it here: the gateway is alone). A key Redis never
/// answered for gets its share.
#[tokio::test(flavor = "multi_thread")]
async fn what_redis_counted_stays_counted_through_an_outage() {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = RedisServer::start();
    let url = redis.url();
    let (gateway, _, _backend) = lone_gateway(dir.path(), &redis);
    let config = dir.path().join("scale-out.toml");
    let minute = enterprise(dir.path(), &config, &url, 3);
    let day = enterprise_day(dir.path(), &config, &url, 100, 2);
    let banned = enterprise(dir.path(), &config, &url, 1);
    let untouched = enterprise(dir.path(), &config, &url, 3);
    let part_minute = enterprise(dir.path(), &config, &url, 10);
    let part_day = enterprise_day(dir.path(), &config, &url, 100, 5);
    gateway.wait_keys(7);
    let c = client();
    let get = |key: &str| c.get(gateway.url("/v1/pets")).bearer_auth(key).send();
    for _ in 0..3 {
        assert_eq!(get(&minute).await.unwrap().status(), 200);
    }
    assert_error(get(&minute).await.unwrap(), 429, "rate_limited").await;
    for _ in 0..2 {
        assert_eq!(get(&day).await.unwrap().status(), 200);
    }
    assert_error(get(&day).await.unwrap(), 429, "quota_exceeded").await;
    assert_eq!(get(&banned).await.unwrap().status(), 200);
    for _ in 0..10 {
        assert_eq!(get(&banned).await.unwrap().status(), 429);
    }
    assert_error(get(&banned).await.unwrap(), 429, "key_banned").await;
    for _ in 0..6 {
        assert_eq!(get(&part_minute).await.unwrap().status(), 200);
    }
    for _ in 0..3 {
        assert_eq!(get(&part_day).await.unwrap().status(), 200);
    }
    assert_all_decided_in_redis(&[&gateway]);

    redis.kill();
    assert_error(get(&minute).await.unwrap(), 429, "rate_limited").await;
    assert_error(get(&day).await.unwrap(), 429, "quota_exceeded").await;
    let r = get(&banned).await.unwrap();
    let retry = retry_after(&r);
    assert!((890..=900).contains(&retry), "Retry-After {retry}");
    assert_error(r, 429, "key_banned").await;
    let standing: serde_json::Value = get_rate_limit(&c, &gateway, &banned).await;
    assert!(standing["banned_until"].is_u64(), "{standing}");
    for _ in 0..3 {
        assert_eq!(get(&untouched).await.unwrap().status(), 200);
    }
    assert_error(get(&untouched).await.unwrap(), 429, "rate_limited").await;
    for _ in 0..4 {
        assert_eq!(get(&part_minute).await.unwrap().status(), 200);
    }
    assert_error(get(&part_minute).await.unwrap(), 429, "rate_limited").await;
    for _ in 0..2 {
        assert_eq!(get(&part_day).await.unwrap().status(), 200);
    }
    assert_error(get(&part_day).await.unwrap(), 429, "quota_exceeded").await;
    assert_eq!(
        metric(gateway.admin, "gateway_limit_store_fallbacks_total"),
        Some(15.0),
        "all decided alone"
    );
}

async fn get_rate_limit(c: &reqwest::Client, g: &GatewayOnly, key: &str) -> serde_json::Value {
    let r = c
        .get(g.url("/v1/rate_limit"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

/// Which node of `cluster` serves the Redis key `name` (the others answer MOVED).
fn owner(cluster: &RedisCluster, name: &str) -> usize {
    cluster
        .nodes
        .iter()
        .position(|n| !n.cli(&["exists", name]).starts_with("MOVED"))
        .expect("one node serves every slot")
}

/// A cluster node that holds a key's state fails while the node with the gateways' heartbeat
/// does not: the gateway falls back once and stays in fallback until that key's state answers
/// again, instead of going back to Redis at each heartbeat and out at the next decision (one
/// outage, not one per heartbeat); with the node back, decisions are made in Redis again.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_cluster_node_is_one_outage_until_its_slots_answer() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = RedisCluster::start();
    let url = cluster.url();
    let config = config(dir.path(), "[gateway.redis]\ntimeout_ms = 5000");
    let backend = Backend::start(&dir.path().join("backend-data"));
    let gateway = GatewayOnly::start(
        dir.path(),
        "a",
        &config,
        backend.addr,
        &["--redis-url", &url],
    );
    wait_store_up(&gateway, true, Duration::from_secs(10));
    let heartbeat = owner(&cluster, "as:gateways");
    let (key, node) = (1..)
        .map(|made| {
            let key = enterprise(dir.path(), &config, &url, 100_000);
            gateway.wait_keys(made);
            let node = owner(&cluster, &format!("as:lim:{{{}}}", key_id(&key)));
            (key, node)
        })
        .find(|(_, node)| *node != heartbeat)
        .unwrap();
    let c = client();
    let get = || c.get(gateway.url("/v1/pets")).bearer_auth(&key).send();
    assert_eq!(get().await.unwrap().status(), 200);
    assert_all_decided_in_redis(&[&gateway]);

    // Within the cluster's node timeout (2 s), the other nodes still serve their slots, the
    // heartbeat's included.
    cluster.nodes[node].kill();
    let killed = Instant::now();
    while killed.elapsed() < Duration::from_millis(1600) {
        assert_eq!(get().await.unwrap().status(), 200);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        metric(gateway.admin, "gateway_limit_store_outages_total"),
        Some(1.0),
        "{}",
        fleet_report(&[&gateway])
    );
    assert_eq!(metric(gateway.admin, "gateway_limit_store_up"), Some(0.0));
    // The cluster client's retries of the node are not each a warning.
    let log = gateway.proc.log_text();
    assert!(!log.contains("Failed to connect to node"), "{log}");
    let lost = format!("connection to {} lost", cluster.nodes[node].addr);
    assert!(log.contains(&lost), "{log}");

    cluster.nodes[node].restart();
    wait_store_up(&gateway, true, Duration::from_secs(30));
    let before = metric(gateway.admin, "gateway_limit_store_fallbacks_total").unwrap();
    for _ in 0..5 {
        assert_eq!(get().await.unwrap().status(), 200);
    }
    assert_eq!(
        metric(gateway.admin, "gateway_limit_store_fallbacks_total"),
        Some(before),
        "decided in redis again\n{}",
        fleet_report(&[&gateway])
    );
}

/// A Redis that loses its data (here restarted without persistence) under a running gateway
/// gets the key records back from that gateway: clients' keys keep working, a revoked key stays
/// revoked, and `keys list` shows both again.
#[tokio::test(flavor = "multi_thread")]
async fn key_records_redis_lost_are_written_back_by_a_running_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = RedisServer::start_with(&["--appendonly", "no"]);
    let url = redis.url();
    let (gateway, key, _backend) = lone_gateway(dir.path(), &redis);
    let config = dir.path().join("scale-out.toml");
    let revoked = enterprise(dir.path(), &config, &url, 100);
    gateway.wait_keys(2);
    keys(dir.path(), &config, &url, &["revoke", key_id(&revoked)]);
    gateway.wait_keys(1);
    let c = client();
    let get = |key: &str| c.get(gateway.url("/v1/pets")).bearer_auth(key).send();
    assert_eq!(get(&key).await.unwrap().status(), 200);
    let loads = metric(gateway.admin, "gateway_key_loads_total").unwrap();

    redis.restart();
    wait_metric(
        gateway.admin,
        "gateway_key_records_restored_total",
        Duration::from_secs(10),
        |v| v == 2.0,
    );
    // The set read back after the restore is in force (and its local copy written).
    wait_metric(
        gateway.admin,
        "gateway_key_loads_total",
        Duration::from_secs(10),
        |v| v == loads + 1.0,
    );
    assert_eq!(get(&key).await.unwrap().status(), 200);
    assert_error(get(&revoked).await.unwrap(), 401, "unauthorized").await;
    assert_eq!(metric(gateway.admin, "gateway_active_keys"), Some(1.0));
    let list = keys(dir.path(), &config, &url, &["list"]);
    assert_eq!(list.lines().count(), 2, "{list}");
    let log = gateway.proc.log_text();
    assert_eq!(log.matches("lost 2 of the key records").count(), 1, "{log}");

    // A local copy that cannot be brought up to date is removed rather than left behind Redis,
    // where it would bring back a key revoked since. (A directory in the way of its temporary
    // file makes the write fail, for root too.)
    let copy = gateway.data_dir.join("keys-cache.json");
    assert!(copy.exists());
    std::fs::create_dir(gateway.data_dir.join("keys-cache.json.tmp")).unwrap();
    enterprise(dir.path(), &config, &url, 100);
    gateway.wait_keys(2);
    assert!(!copy.exists(), "the stale copy is gone");
    assert!(
        gateway
            .proc
            .log_text()
            .contains("removed it, so that no stale copy is used")
    );
}

/// The restore's own rule, on a real Redis: a missing record is written, a revoked record goes
/// over one that is not, one that is not never goes over a revoked one, and the version moves so
/// every gateway reloads.
#[test]
fn a_restore_writes_missing_records_and_never_undoes_a_revocation() {
    use animal_store_gateway::keys::KeyRecord;
    use animal_store_gateway::redis_conn::{RedisHub, RedisTarget};
    use animal_store_gateway::redis_keys::RedisKeyStore;

    let redis = RedisServer::start();
    let hub = RedisHub::start(RedisTarget::new(vec![redis.url()])).unwrap();
    let store = RedisKeyStore::new(hub.clone());
    let record = |id: &str, revoked: Option<u64>| KeyRecord {
        id: id.to_owned(),
        name: None,
        plan: "free".to_owned(),
        per_minute: None,
        per_day: None,
        sha256: "0".repeat(64),
        created: 1,
        revoked,
        expires: None,
        successor: None,
        counters: None,
    };
    let in_redis = [record("a", None), record("b", Some(5))];
    hub.block_on(store.update(|keys| {
        keys.extend(in_redis.iter().cloned());
        Ok(())
    }))
    .unwrap();
    let (before, _) = hub.block_on(store.load()).unwrap();

    let written = hub
        .block_on(store.restore(&[record("a", Some(7)), record("b", None), record("c", None)]))
        .unwrap();
    assert_eq!(written, 2);
    let (after, records) = hub.block_on(store.load()).unwrap();
    assert!(after > before, "the version moved: {before} -> {after}");
    let revoked = |id: &str| records.iter().find(|r| r.id == id).unwrap().revoked;
    assert_eq!(revoked("a"), Some(7), "a revocation goes over");
    assert_eq!(revoked("b"), Some(5), "and is never undone");
    assert_eq!(revoked("c"), None, "a missing record is written");
}

/// A refusal is forgotten once Redis admits the key again (here its plan's limit was raised by a
/// reload), so an outage after that does not refuse it on Redis's old word.
#[tokio::test(flavor = "multi_thread")]
async fn a_refusal_redis_took_back_is_not_kept_through_an_outage() {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = RedisServer::start();
    let url = redis.url();
    let plan = |per_minute: u32| {
        format!(
            "[gateway.redis]\ntimeout_ms = 5000\n[gateway.plans.pro]\nper_minute = {per_minute}\nper_day = 1000"
        )
    };
    let path = config(dir.path(), &plan(2));
    let backend = Backend::start(&dir.path().join("backend-data"));
    let gateway = GatewayOnly::start(dir.path(), "a", &path, backend.addr, &["--redis-url", &url]);
    let key = keys(dir.path(), &path, &url, &["create", "--plan", "pro"]);
    gateway.wait_keys(1);
    let c = client();
    let get = || c.get(gateway.url("/v1/pets")).bearer_auth(&key).send();
    for _ in 0..2 {
        assert_eq!(get().await.unwrap().status(), 200);
    }
    assert_error(get().await.unwrap(), 429, "rate_limited").await;

    // The plan's limit raised: Redis admits the key again.
    config(dir.path(), &plan(100));
    kill(gateway.proc.pid(), Signal::SIGHUP).unwrap();
    gateway.proc.wait_log("configuration reloaded");
    assert_eq!(get().await.unwrap().status(), 200);
    assert_all_decided_in_redis(&[&gateway]);

    redis.kill();
    assert_eq!(get().await.unwrap().status(), 200, "decided alone, afresh");
    assert_eq!(
        metric(gateway.admin, "gateway_limit_store_fallbacks_total"),
        Some(1.0)
    );
}

/// A gateway started after Redis lost its data does not write back its data directory's copy:
/// the copy may be of another Redis. The keys stay lost (the README says to run Redis with
/// persistence).
#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_started_after_redis_lost_its_data_does_not_restore() {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = RedisServer::start_with(&["--appendonly", "no"]);
    let url = redis.url();
    let (mut gateway, key, backend) = lone_gateway(dir.path(), &redis);
    assert!(gateway.data_dir.join("keys-cache.json").exists());
    gateway.proc.terminate();
    redis.restart();

    let config = dir.path().join("scale-out.toml");
    let again = GatewayOnly::start(
        dir.path(),
        "a",
        &config,
        backend.addr,
        &["--redis-url", &url],
    );
    let r = client()
        .get(again.url("/v1/pets"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_error(r, 401, "unauthorized").await;
    assert_eq!(
        metric(again.admin, "gateway_key_records_restored_total"),
        Some(0.0)
    );
    assert_eq!(redis.cli(&["hlen", "as:{keys}"]).trim(), "0");
}

/// Redis over TLS: with `rediss://` and `gateway.redis.ca`, `keys create` and two gateways verify
/// Redis's certificate against that CA and keep keys and limits there, exactly. With a CA that
/// did not sign it, `keys` makes no connection and says why; `check-config` refuses a CA for
/// plain `redis://` URLs, which would never use it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_is_verified_against_the_configured_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = common::tls::TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "redis", false);
    let ca_file = ca.write_pem(dir.path());
    let redis = RedisServer::start_tls(&ca_file, &cert, &key);
    let url = redis.url();
    assert!(url.starts_with("rediss://"));
    let redis_table = |ca: &Path| {
        format!(
            "[gateway.redis]\ntimeout_ms = 5000\nca = \"{}\"",
            ca.display()
        )
    };
    let config = config(dir.path(), &redis_table(&ca_file));
    let backend = Backend::start(&dir.path().join("backend-data"));
    let a = GatewayOnly::start(
        dir.path(),
        "a",
        &config,
        backend.addr,
        &["--redis-url", &url],
    );
    let b = GatewayOnly::start(
        dir.path(),
        "b",
        &config,
        backend.addr,
        &["--redis-url", &url],
    );
    let key = enterprise(dir.path(), &config, &url, 3);
    a.wait_keys(1);
    b.wait_keys(1);
    let statuses = burst(&[&a, &b], &key, 6).await;
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        3,
        "{statuses:?}"
    );
    assert!(
        redis.cli(&["DBSIZE"]).trim().parse::<u64>().unwrap() > 0,
        "the key and its counts are in Redis"
    );

    let other_dir = dir.path().join("other");
    std::fs::create_dir(&other_dir).unwrap();
    let other_ca = common::tls::TestCa::new().write_pem(&other_dir);
    let other_config = dir.path().join("other.toml");
    std::fs::write(
        &other_config,
        format!("[gateway]\n{}\n{PETS_ROUTE}", redis_table(&other_ca)),
    )
    .unwrap();
    let (code, _, stderr) = cli(&[
        "keys",
        "create",
        "--plan",
        "free",
        "--config",
        other_config.to_str().unwrap(),
        "--data-dir",
        dir.path().join("cli-other").to_str().unwrap(),
        "--redis-url",
        &url,
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("certificate"), "{stderr}");

    let plain = dir.path().join("plain.toml");
    std::fs::write(
        &plain,
        format!(
            "[gateway.redis]\nurl = \"redis://127.0.0.1:6379\"\nca = \"{}\"\n",
            ca_file.display()
        ),
    )
    .unwrap();
    let (code, _, stderr) = cli(&["check-config", plain.to_str().unwrap()]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("gateway.redis.ca"), "{stderr}");
}
