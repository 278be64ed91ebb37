//! One table of limiter cases, run against every limit store: the embedded store (Rust, in this
//! process) and the Redis store (the script, in a real `redis-server`). Window edges, UTC
//! midnight, both limits spent, bans and their doubling, and keys that do not affect each
//! other: if the script and `KeyState::check` ever drift apart, this fails.

mod common;

use std::sync::Arc;

use animal_store_gateway::bans::BanPolicy;
use animal_store_gateway::keys::KeyId;
use animal_store_gateway::limits::{DAY_MS, Decision, MINUTE_MS, Verdict};
use animal_store_gateway::plans::Limits;
use animal_store_gateway::redis_conn::{RedisHub, RedisTarget};
use animal_store_gateway::store::{EmbeddedStore, Fallback, RedisStore};
use common::redis::{RedisCluster, RedisServer};

/// 2026-11-22T10:00:00Z, well inside a UTC day.
const T0: u64 = 1_795_341_600_000;
const MIDNIGHT: u64 = (T0 / DAY_MS + 1) * DAY_MS;
const MIN: u64 = MINUTE_MS;
const BAN: u64 = 15 * MIN;

/// One request of the table and what the store must answer.
struct Step {
    key: u64,
    limits: (u64, u64),
    at: u64,
    verdict: Verdict,
    window: &'static str,
    remaining: u64,
    reset: u64,
}

fn step(
    key: u64,
    limits: (u64, u64),
    at: u64,
    verdict: Verdict,
    window: &'static str,
    remaining: u64,
    reset: u64,
) -> Step {
    Step {
        key,
        limits,
        at,
        verdict,
        window,
        remaining,
        reset,
    }
}

/// The table. Keys are numbered per case so cases cannot disturb each other.
fn table() -> Vec<Step> {
    use Verdict::*;
    let mut t = Vec::new();
    // 1. A minute window opens at the first request, counts down, and reopens exactly at its end.
    let l = (3, 100);
    t.push(step(1, l, T0 + 500, Admitted, "minute", 2, T0 + 500 + MIN));
    t.push(step(1, l, T0 + 900, Admitted, "minute", 1, T0 + 500 + MIN));
    t.push(step(
        1,
        l,
        T0 + 30_000,
        Admitted,
        "minute",
        0,
        T0 + 500 + MIN,
    ));
    t.push(step(
        1,
        l,
        T0 + 30_001,
        RateLimited,
        "minute",
        0,
        T0 + 500 + MIN,
    ));
    t.push(step(
        1,
        l,
        T0 + 500 + MIN - 1,
        RateLimited,
        "minute",
        0,
        T0 + 500 + MIN,
    ));
    // Refusals did not count: the new window has its whole limit.
    t.push(step(
        1,
        l,
        T0 + 500 + MIN,
        Admitted,
        "minute",
        2,
        T0 + 500 + 2 * MIN,
    ));
    // 2. The day quota runs to UTC midnight and reopens there; headers show the day window
    //    once it has fewer requests left than the minute.
    let l = (1000, 3);
    let late = MIDNIGHT - 90_000;
    t.push(step(2, l, late, Admitted, "day", 2, MIDNIGHT));
    t.push(step(2, l, late + 1, Admitted, "day", 1, MIDNIGHT));
    t.push(step(2, l, late + 2, Admitted, "day", 0, MIDNIGHT));
    t.push(step(2, l, late + 1000, QuotaExceeded, "day", 0, MIDNIGHT));
    t.push(step(2, l, MIDNIGHT - 1, QuotaExceeded, "day", 0, MIDNIGHT));
    t.push(step(2, l, MIDNIGHT, Admitted, "day", 2, MIDNIGHT + DAY_MS));
    // 3. Both spent at once: the day is the longer wait, so the day is what is reported.
    let l = (2, 2);
    t.push(step(3, l, T0, Admitted, "minute", 1, T0 + MIN));
    t.push(step(3, l, T0 + 1, Admitted, "minute", 0, T0 + MIN));
    t.push(step(3, l, T0 + 2, QuotaExceeded, "day", 0, MIDNIGHT));
    // 4. Ties go to the minute window.
    t.push(step(4, (5, 5), T0, Admitted, "minute", 4, T0 + MIN));
    // 5. Eleven refusals in one window ban for 15 minutes; the ban ends exactly on time.
    let l = (1, 1000);
    t.push(step(5, l, T0, Admitted, "minute", 0, T0 + MIN));
    for i in 1..=10 {
        t.push(step(5, l, T0 + i, RateLimited, "minute", 0, T0 + MIN));
    }
    t.push(step(5, l, T0 + 11, Banned, "minute", 0, T0 + 11 + BAN));
    t.push(step(
        5,
        l,
        T0 + 11 + BAN - 1,
        Banned,
        "minute",
        0,
        T0 + 11 + BAN,
    ));
    // Other keys are unaffected by a ban.
    t.push(step(6, l, T0 + 12, Admitted, "minute", 0, T0 + 12 + MIN));
    let t1 = T0 + 11 + BAN;
    t.push(step(5, l, t1, Admitted, "minute", 0, t1 + MIN));
    // 6. A second ban within 24 hours lasts twice as long, a third four times.
    for i in 1..=10 {
        t.push(step(5, l, t1 + i, RateLimited, "minute", 0, t1 + MIN));
    }
    t.push(step(5, l, t1 + 11, Banned, "minute", 0, t1 + 11 + 2 * BAN));
    let t2 = t1 + 11 + 2 * BAN;
    t.push(step(5, l, t2, Admitted, "minute", 0, t2 + MIN));
    for i in 1..=10 {
        t.push(step(5, l, t2 + i, RateLimited, "minute", 0, t2 + MIN));
    }
    t.push(step(5, l, t2 + 11, Banned, "minute", 0, t2 + 11 + 4 * BAN));
    // 7. A day after the last ban began, the doubling starts over.
    let t3 = t2 + 11 + DAY_MS;
    t.push(step(5, l, t3, Admitted, "minute", 0, t3 + MIN));
    for i in 1..=10 {
        t.push(step(5, l, t3 + i, RateLimited, "minute", 0, t3 + MIN));
    }
    t.push(step(5, l, t3 + 11, Banned, "minute", 0, t3 + 11 + BAN));
    t
}

/// Runs the table through `check`, naming the store in any failure.
fn run_table(store: &str, base: u64, mut check: impl FnMut(KeyId, Limits, u64) -> Decision) {
    let mut last = std::collections::HashMap::<u64, Verdict>::new();
    for (i, s) in table().iter().enumerate() {
        let limits = Limits {
            per_minute: s.limits.0,
            per_day: s.limits.1,
        };
        let d = check(KeyId(base + s.key), limits, s.at);
        let got = (d.verdict, d.quota.name, d.quota.remaining, d.quota.reset_ms);
        let want = (s.verdict, s.window, s.remaining, s.reset);
        assert_eq!(
            got,
            want,
            "{store} store, step {i} (key {}, at T0{:+})",
            s.key,
            s.at as i64 - T0 as i64
        );
        let limit = if s.window == "day" {
            s.limits.1
        } else {
            s.limits.0
        };
        assert_eq!(d.quota.limit, limit, "{store} store, step {i}: limit");
        // The refusal that imposes a ban says so; requests refused during it do not.
        let imposed = s.verdict == Verdict::Banned && last.get(&s.key) != Some(&Verdict::Banned);
        assert_eq!(
            d.ban_imposed, imposed,
            "{store} store, step {i}: ban imposed"
        );
        last.insert(s.key, s.verdict);
    }
}

fn base() -> u64 {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).unwrap();
    u64::from_le_bytes(b) & 0xffff_ffff_ffff_0000
}

#[test]
fn the_embedded_store_follows_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), BanPolicy::default()).unwrap();
    run_table("embedded", base(), |k, l, t| {
        store.check(k, l, &BanPolicy::default(), t)
    });
}

fn redis_store(url: &str) -> Arc<RedisStore> {
    let hub = RedisHub::start(RedisTarget::new(vec![url.to_owned()])).unwrap();
    let store = RedisStore::start(hub, std::time::Duration::from_secs(2), Fallback::Deny);
    assert!(store.is_up(), "the store reached {url}");
    store
}

#[test]
fn the_redis_store_follows_the_table() {
    let redis = RedisServer::start();
    run_redis_table("redis", &redis.url());
}

/// The table through a Redis store on `url`; its `deny` fallback turns any silent fallback
/// into a failure.
fn run_redis_table(name: &str, url: &str) {
    let store = redis_store(url);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    run_table(name, base(), |k, l, t| {
        runtime
            .block_on(store.check(k, l, &BanPolicy::default(), t))
            .unwrap_or_else(|_| panic!("{name} decided"))
    });
    assert!(store.is_up());
}

#[test]
fn the_redis_store_follows_the_table_on_a_cluster() {
    let cluster = RedisCluster::start();
    run_redis_table("redis cluster", &cluster.url());
    // The keys of the table landed on more than one master: the slots really are spread.
    let holding = cluster
        .nodes
        .iter()
        .filter(|n| n.cli(&["dbsize"]).trim() != "0")
        .count();
    assert!(holding >= 2, "state of several keys on {holding} node(s)");
}

#[test]
fn the_redis_store_admits_exactly_the_limit_under_concurrency() {
    let redis = RedisServer::start();
    let store = redis_store(&redis.url());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let key = KeyId(base());
    let limits = Limits {
        per_minute: 60,
        per_day: 1000,
    };
    let admitted = runtime.block_on(async {
        let tasks: Vec<_> = (0..400)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(
                    async move { store.check(key, limits, &BanPolicy::default(), T0).await },
                )
            })
            .collect();
        let mut admitted = 0;
        for task in tasks {
            let decision = task.await.unwrap().expect("redis decided");
            admitted += usize::from(decision.verdict == Verdict::Admitted);
        }
        admitted
    });
    assert_eq!(admitted, 60);
}

/// A store that has left the live set stays out of it: its heartbeats (one every half second,
/// each a `ZADD` of this gateway) stop, so a gateway that is shutting down is not counted among
/// those sharing the limits until its entry grows stale. A store that has not left is counted.
#[test]
fn a_store_that_left_the_live_set_is_not_put_back_by_its_heartbeat() {
    let redis = RedisServer::start();
    let stays = redis_store(&redis.url());
    let leaves = redis_store(&redis.url());
    assert_eq!(redis.cli(&["ZCARD", "as:gateways"]).trim(), "2");
    leaves.leave();
    assert_eq!(redis.cli(&["ZCARD", "as:gateways"]).trim(), "1");
    // Three heartbeats' time: each store would have beaten at least twice.
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    assert_eq!(
        redis.cli(&["ZCARD", "as:gateways"]).trim(),
        "1",
        "a heartbeat after leaving put the store back"
    );
    drop(stays);
}
