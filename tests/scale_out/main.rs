//! Several gateways, one Redis: real `animal-store gateway` processes over one backend and a
//! real `redis-server` (or a three-master cluster), all on ephemeral loopback ports. One
//! test binary: the helpers here, the tests in a module per concern.

#[path = "../common/mod.rs"]
mod common;

mod key_records;
mod outages;
mod sharing;

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
