//! Gateways deciding in one Redis: keys, limits and bans shared exactly on one server, on a
//! cluster and over TLS; a slow Redis within the timeout; each proxy thread's own connection; the
//! count of gateways alive.

use super::*;

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

/// `keys ARGS` with `ANIMAL_STORE_REDIS_URL` set to `env_url`, from a data directory no gateway
/// uses; returns (exit code, stdout, stderr).
fn keys_from_env(dir: &Path, config: &Path, env_url: &str, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(common::BIN)
        .arg("keys")
        .args(args)
        .args(["--config", config.to_str().unwrap()])
        .args(["--data-dir", dir.join("cli-data").to_str().unwrap()])
        .env(common::REDIS_URL_ENV, env_url)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run animal-store keys");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The Redis URL may come from the environment (`ANIMAL_STORE_REDIS_URL`), where a password in
/// it stays out of the process list and the configuration file: `keys create` and a gateway
/// given no `--redis-url` both use it, so the gateway, whose data directory holds no key,
/// admits the key made elsewhere. The flag, when given, wins over it.
#[tokio::test(flavor = "multi_thread")]
async fn the_redis_url_may_come_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start();
    let url = redis.url();
    let config = config(dir.path(), "[gateway.redis]\ntimeout_ms = 5000");
    let backend = Backend::start(&dir.path().join("backend-data"));
    let from_env = format!("export {}={url}", common::REDIS_URL_ENV);
    let gateway =
        GatewayOnly::start_after(Some(&from_env), dir.path(), "a", &config, backend.addr, &[]);
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", gateway.proc.child.id())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains("redis://"));

    let (code, key, stderr) =
        keys_from_env(dir.path(), &config, &url, &["create", "--plan", "pro"]);
    assert_eq!(code, 0, "{stderr}");
    gateway.wait_keys(1);
    let r = client()
        .get(gateway.url("/v1/pets"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-ratelimit-limit"], "300", "a Pro key");

    // A flag given beside the variable is the one used.
    let nowhere = "redis://127.0.0.1:1";
    let (code, list, stderr) =
        keys_from_env(dir.path(), &config, nowhere, &["list", "--redis-url", &url]);
    assert_eq!((code, list.lines().count()), (0, 1), "{list}{stderr}");
    let (code, _, stderr) = keys_from_env(dir.path(), &config, nowhere, &["list"]);
    assert_ne!(
        code, 0,
        "the variable alone names a Redis that is not there: {stderr}"
    );
}

/// A Redis password in a configuration file every user of the machine may read is named in a
/// warning, by `check-config` (which still passes) and at a gateway's start (which goes on, here
/// with Redis away), with the file, its mode, the `chmod` that closes it and the variable that
/// keeps the URL out of files; the password itself is never printed. Closed to others (0640), or
/// without a password in it, the file gets no warning.
#[test]
fn a_redis_password_in_a_file_every_user_may_read_is_named_in_a_warning() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let secret = "s3cret-pw";
    let with_password = config(
        dir.path(),
        &format!("[gateway.redis]\nurl = \"redis://:{secret}@127.0.0.1:1\"\ntimeout_ms = 50"),
    );
    let set_mode = |mode: u32| {
        std::fs::set_permissions(&with_password, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    let warning = format!(
        "{file} holds a Redis password (gateway.redis.url), and every user of this machine may \
         read it (mode 0644): `chmod o-rwx {file}` keeps it to its owner and group; or give the \
         URL in ANIMAL_STORE_REDIS_URL, which keeps it out of the file",
        file = with_password.display()
    );
    set_mode(0o644);
    let (code, _, stderr) = cli(&["check-config", with_password.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stderr, format!("warning: {warning}\n"));

    let gateway = GatewayOnly::start(dir.path(), "a", &with_password, free_addr(), &[]);
    let log = gateway.proc.wait_log(&warning);
    assert!(!log.contains(secret), "{log}");
    drop(gateway);

    set_mode(0o640);
    let (code, _, stderr) = cli(&["check-config", with_password.to_str().unwrap()]);
    assert_eq!((code, stderr.as_str()), (0, ""));
    let without = dir.path().join("without.toml");
    std::fs::write(
        &without,
        format!("[gateway.redis]\nurl = \"redis://127.0.0.1:1\"\n{PETS_ROUTE}"),
    )
    .unwrap();
    std::fs::set_permissions(&without, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, _, stderr) = cli(&["check-config", without.to_str().unwrap()]);
    assert_eq!((code, stderr.as_str()), (0, ""));
}
