//! What Redis lost of the keys' records: written back by a running gateway, never undoing a
//! revocation, and not restored by a gateway that started after the loss. A gateway that could
//! read no keys at all at its start.

use super::*;

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

/// A gateway that could read neither Redis nor a local copy of its keys at its start knows no
/// key, so it says nothing about one: `/readyz` is 503 and a key gets `503 unavailable` (not a
/// `401` that would tell a client its valid key is bad, nor a failure against its address's
/// budget) until Redis answers. A request with no key is still a `401`. The next start has the
/// copy the first load wrote, and is ready with Redis away.
#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_that_never_read_its_keys_is_unready_and_calls_no_key_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let redis_addr = free_addr();
    let url = format!("redis://{redis_addr}");
    let config = config(dir.path(), "[gateway.redis]\ntimeout_ms = 100");
    let backend = Backend::start(&dir.path().join("backend-data"));
    let start = || {
        GatewayOnly::start(
            dir.path(),
            "a",
            &config,
            backend.addr,
            &["--redis-url", &url],
        )
    };
    let c = client();
    let readyz = async |g: &GatewayOnly| {
        let r = c
            .get(format!("http://{}/readyz", g.admin))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    let get = async |g: &GatewayOnly, key: &str| {
        c.get(g.url("/v1/pets"))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
    };

    let mut gateway = start();
    let (status, body) = readyz(&gateway).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains(r#""key_store":"not loaded""#), "{body}");
    let stranger = format!("as_{}_{}", "0".repeat(16), "1".repeat(64));
    for _ in 0..70 {
        // More than the 60 failures a minute an address may have: none is counted, as the
        // address's budget in the headers says.
        let r = get(&gateway, &stranger).await;
        assert_eq!(r.headers()["retry-after"], "1");
        assert_eq!(r.headers()["x-ratelimit-limit"], "60");
        assert_eq!(r.headers()["x-ratelimit-remaining"], "60");
        let body = assert_error(r, 503, "unavailable").await;
        assert!(
            body["message"].as_str().unwrap().contains("key store"),
            "{body}"
        );
    }
    let r = c.get(gateway.url("/v1/pets")).send().await.unwrap();
    assert_error(r, 401, "unauthorized").await;

    let mut redis = RedisServer::start_at(redis_addr, &[]);
    let key = enterprise(dir.path(), &config, &url, 1000);
    gateway.wait_keys(1);
    assert_eq!(get(&gateway, &key).await.status(), 200);
    assert_error(get(&gateway, &stranger).await, 401, "unauthorized").await;
    assert_eq!(readyz(&gateway).await.0, 200);

    gateway.proc.terminate();
    redis.kill();
    let again = start();
    assert_eq!(readyz(&again).await.0, 200, "ready from the local copy");
    assert_eq!(get(&again, &key).await.status(), 200);
}
