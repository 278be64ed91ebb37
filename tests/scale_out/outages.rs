//! Redis away: the fallback's shares and its return to exact limits, a gateway started without
//! Redis, what Redis counted kept through an outage, a failed cluster node, refusals taken back.

use super::*;

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
    let before = common::unix_now();
    let r = c
        .get(g.url("/v1/pets"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let after = common::unix_now();
    assert_eq!(r.headers()["retry-after"], "1");
    // The key's minute window, with nothing left until that retry, as every response says.
    assert_eq!(r.headers()["x-ratelimit-limit"], "1000");
    assert_eq!(r.headers()["x-ratelimit-remaining"], "0");
    let reset: u64 = r.headers()["x-ratelimit-reset"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (before + 1..=after + 2).contains(&reset),
        "reset {reset}, asked from {before} to {after}"
    );
    assert_error(r, 503, "unavailable").await;
    // The keys it knew stay known while Redis is away.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(metric(g.admin, "gateway_active_keys"), Some(1.0));
    assert!(metric(g.admin, "gateway_key_reload_failures").unwrap() > 0.0);
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

/// Which node of `cluster` serves the Redis key `name` (the others answer MOVED).
fn owner(cluster: &RedisCluster, name: &str) -> usize {
    cluster
        .nodes
        .iter()
        .position(|n| !n.cli(&["exists", name]).starts_with("MOVED"))
        .expect("one node serves every slot")
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
