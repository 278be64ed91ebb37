//! TLS and HTTP/2 at the edge, through the real binary, with certificates the tests make.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use common::tls::{TestCa, exchange, list_and_close};
use common::{Stack, assert_error, cli, client, free_addr, metric, shipped_config, wait_metric};
use nix::sys::signal::{Signal, kill};
use reqwest::Version;

/// A stack with the shipped configuration serving HTTPS on an extra port with `cert` and `key`.
fn tls_stack(dir: &Path, cert: &Path, key: &Path) -> (Stack, SocketAddr) {
    Stack::start_tls(dir, &shipped_config(), cert, key)
}

/// The contract's headers a response carries, by name, for comparing protocols.
fn contract_headers(r: &reqwest::Response) -> Vec<String> {
    let mut names: Vec<String> = [
        "content-type",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "ratelimit",
        "ratelimit-policy",
        "x-request-id",
        "retry-after",
        "www-authenticate",
        "deprecation",
        "sunset",
        "link",
        "location",
    ]
    .iter()
    .filter(|n| r.headers().contains_key(**n))
    .map(|n| (*n).to_owned())
    .collect();
    names.sort();
    names
}

/// Sends `request`, checks the HTTP version it was answered in, and records the status and the
/// contract's header names.
async fn send(
    request: reqwest::RequestBuilder,
    version: Option<Version>,
    seen: &mut Vec<(u16, Vec<String>)>,
) -> reqwest::Response {
    let r = request.send().await.unwrap();
    if let Some(v) = version {
        assert_eq!(r.version(), v, "{} {}", r.url(), r.status());
    }
    seen.push((r.status().as_u16(), contract_headers(&r)));
    r
}

/// One pass of the contract's answers over one client and base URL: 200, 201, a deprecated
/// 200, 401, 404, 413, 429. Returns (status, header names) per step.
async fn contract_pass(
    stack: &Stack,
    c: &reqwest::Client,
    base: &str,
    version: Option<Version>,
) -> Vec<(u16, Vec<String>)> {
    let key = stack.key(&["--plan", "pro"]);
    let one = stack.enterprise_key(1, 1000);
    let mut seen = Vec::new();
    let r = send(
        c.get(format!("{base}/v1/pets")).bearer_auth(&key),
        version,
        &mut seen,
    )
    .await;
    assert_eq!(r.status(), 200);
    let pet = c
        .post(format!("{base}/v1/pets"))
        .bearer_auth(&key)
        .json(&serde_json::json!({"name": "Rex", "categoryId": 1}));
    let r = send(pet, version, &mut seen).await;
    let location = r.headers()["location"].to_str().unwrap().to_owned();
    let r = send(
        c.get(format!("{base}{location}")).bearer_auth(&key),
        version,
        &mut seen,
    )
    .await;
    assert!(r.headers().contains_key("deprecation"));
    let r = send(c.get(format!("{base}/v1/pets")), version, &mut seen).await;
    assert_error(r, 401, "unauthorized").await;
    let r = send(
        c.get(format!("{base}/v1/nothing")).bearer_auth(&key),
        version,
        &mut seen,
    )
    .await;
    assert_error(r, 404, "not_found").await;
    let big = c
        .post(format!("{base}/v1/pets"))
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .body(vec![b' '; 2 * 1024 * 1024]);
    let r = send(big, version, &mut seen).await;
    assert_error(r, 413, "payload_too_large").await;
    send(
        c.get(format!("{base}/v1/pets")).bearer_auth(&one),
        version,
        &mut seen,
    )
    .await;
    let r = send(
        c.get(format!("{base}/v1/pets")).bearer_auth(&one),
        version,
        &mut seen,
    )
    .await;
    assert_error(r, 429, "rate_limited").await;
    seen
}

#[tokio::test]
async fn https_over_http2_and_http1_answers_exactly_as_plain_http() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let (stack, tls) = tls_stack(dir.path(), &cert, &key);
    let https = format!("https://localhost:{}", tls.port());
    let plain = contract_pass(&stack, &client(), &format!("http://{}", stack.listen), None).await;
    let h2 = contract_pass(&stack, &ca.client(false), &https, Some(Version::HTTP_2)).await;
    let h1 = contract_pass(&stack, &ca.client(true), &https, Some(Version::HTTP_11)).await;
    assert_eq!(
        plain.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        [200, 201, 200, 401, 404, 413, 200, 429]
    );
    assert_eq!(h2, plain, "HTTP/2 over TLS");
    assert_eq!(h1, plain, "HTTP/1.1 over TLS");
}

/// The gateway agrees on the hybrid post-quantum key exchange with a client that offers it first,
/// as browsers do, and on a classic group with one that offers only classic groups, serving a GET
/// over each; a client whose only group the gateway does not offer is refused in the handshake.
#[tokio::test]
async fn post_quantum_key_exchange_is_agreed_first_and_classic_groups_still_serve() {
    use tokio_rustls::rustls::NamedGroup;
    use tokio_rustls::rustls::crypto::aws_lc_rs::{DEFAULT_KX_GROUPS, kx_group};
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let (stack, tls) = tls_stack(dir.path(), &cert, &key);
    let api_key = stack.key(&["--plan", "pro"]);
    let request = list_and_close(&api_key);
    for (offered, agreed) in [
        (DEFAULT_KX_GROUPS, NamedGroup::X25519MLKEM768),
        (
            &[kx_group::X25519, kx_group::SECP256R1][..],
            NamedGroup::X25519,
        ),
        (&[kx_group::SECP384R1][..], NamedGroup::secp384r1),
    ] {
        let mut s = ca
            .connect_offering(tls, b"http/1.1", offered)
            .await
            .unwrap();
        assert_eq!(
            s.get_ref()
                .1
                .negotiated_key_exchange_group()
                .map(|g| g.name()),
            Some(agreed)
        );
        let answer = exchange(&mut s, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 200 "), "{agreed:?}: {answer}");
    }
    let refused = ca
        .connect_offering(tls, b"http/1.1", &[kx_group::MLKEM1024])
        .await;
    assert!(
        refused.is_err(),
        "MLKEM1024 alone is not among the gateway's groups"
    );
}

/// Large bodies cross HTTP/2 whole, many streams at a time on one connection: 100 creates at
/// once, then the docs page's 2.3 MB script (served by the gateway itself) and full pages of 100
/// pets with 100-character names (the upstream's), each as plain HTTP gives them. The vendored
/// `h2` frees a waiting connection's buffers and allocates them again (`vendor/README.md`); this
/// checks, end to end, that no byte is lost in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_on_many_http2_streams_at_once_arrive_whole() {
    use futures_util::future::join_all;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let (stack, tls) = tls_stack(dir.path(), &cert, &key);
    let api_key = stack.key(&[
        "--plan",
        "enterprise",
        "--per-minute",
        "100000",
        "--per-day",
        "1000000",
    ]);
    let https = format!("https://localhost:{}", tls.port());
    let plain = format!("http://{}", stack.listen);
    let h2 = ca.client(false);

    let creates = (0..100).map(|i| {
        h2.post(format!("{https}/v1/pets"))
            .bearer_auth(&api_key)
            .json(
                &serde_json::json!({"name": format!("{i:03}{}", "n".repeat(97)), "categoryId": 1}),
            )
            .send()
    });
    let mut ids = Vec::new();
    for created in join_all(creates).await {
        let created = created.unwrap();
        assert_eq!(created.version(), Version::HTTP_2);
        assert_eq!(created.status(), 201);
        ids.push(
            created.json::<serde_json::Value>().await.unwrap()["id"]
                .as_i64()
                .unwrap(),
        );
    }
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 100, "every create made its own pet");

    for path in ["/v1/docs/redoc.standalone.js", "/v1/pets?limit=100"] {
        let expected = client()
            .get(format!("{plain}{path}"))
            .bearer_auth(&api_key)
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert!(expected.len() > 15_000, "{path}: {} bytes", expected.len());
        // Each stream's body is read as it comes, all at once: a body left unread would hold
        // the connection's flow-control window and stall the others.
        let gets = (0..8).map(|_| async {
            let got = h2
                .get(format!("{https}{path}"))
                .bearer_auth(&api_key)
                .send()
                .await
                .unwrap();
            let head = (got.version(), got.status().as_u16());
            (head, got.bytes().await.unwrap())
        });
        for (head, body) in join_all(gets).await {
            assert_eq!(head, (Version::HTTP_2, 200), "{path}");
            assert!(body == expected, "{path}: not the same bytes");
        }
    }
}

/// HEAD is answered as GET would be, head only, by the gateway's own pages and errors and by
/// the upstream alike, over plain HTTP, HTTPS/1.1 and HTTP/2 (where a body after HEAD would be
/// a protocol error).
#[tokio::test]
async fn head_gets_the_head_of_get_and_no_body_over_every_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let (stack, tls) = tls_stack(dir.path(), &cert, &key);
    let api_key = stack.key(&["--plan", "pro"]);
    let https = format!("https://localhost:{}", tls.port());
    let plain = format!("http://{}", stack.listen);
    let created = client()
        .post(format!("{plain}/v1/pets"))
        .bearer_auth(&api_key)
        .json(&serde_json::json!({"name": "Rex", "categoryId": 1}))
        .send()
        .await
        .unwrap();
    let pet = created.headers()["location"].to_str().unwrap().to_owned();
    let protocols = [
        (client(), plain.as_str(), Version::HTTP_11),
        (ca.client(true), https.as_str(), Version::HTTP_11),
        (ca.client(false), https.as_str(), Version::HTTP_2),
    ];
    for (c, base, version) in &protocols {
        for (path, with_key, status) in [
            ("/v1/pets", true, 200),
            (pet.as_str(), true, 200),
            ("/v1/pets/424242", true, 404),
            ("/v1/docs", false, 200),
            ("/v1/openapi.yaml", false, 200),
            ("/v1/rate_limit", true, 200),
            ("/v1/nothing", true, 404),
            ("/v1/pets", false, 401),
        ] {
            let send = |method: reqwest::Method| {
                let request = c.request(method, format!("{base}{path}"));
                let request = if with_key {
                    request.bearer_auth(&api_key)
                } else {
                    request
                };
                request.send()
            };
            let get = send(reqwest::Method::GET).await.unwrap();
            let head = send(reqwest::Method::HEAD).await.unwrap();
            let at = format!("{version:?} HEAD {path}");
            assert_eq!(head.version(), *version, "{at}");
            assert_eq!(
                (get.status().as_u16(), head.status().as_u16()),
                (status, status),
                "{at}"
            );
            assert_eq!(contract_headers(&head), contract_headers(&get), "{at}");
            assert_eq!(
                head.headers().get("content-length"),
                get.headers().get("content-length"),
                "{at}"
            );
            assert!(!get.bytes().await.unwrap().is_empty(), "{at}");
            assert!(head.bytes().await.expect(&at).is_empty(), "{at}");
        }
    }
}

#[test]
fn plain_http_sent_to_the_tls_port_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let (_stack, tls) = tls_stack(dir.path(), &cert, &key);
    let mut s = TcpStream::connect(tls).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = Instant::now();
    s.write_all(b"GET /v1/pets HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
        .expect("closed, not left hanging");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        answer.first(),
        Some(&0x15),
        "a TLS alert, then the connection closes"
    );
}

#[tokio::test]
async fn an_unparsable_request_over_https_gets_the_contract_error() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let (_stack, tls) = tls_stack(dir.path(), &cert, &key);
    // Unparsable, and a target pingora would correct (`/v1/pets%20x`) rather than refuse.
    for request in [
        &b"NONSENSE\r\n\r\n"[..],
        b"GET /v1/pets x HTTP/1.1\r\nHost: x\r\n\r\n",
    ] {
        let answer = exchange(&mut ca.connect_http1(tls).await, request).await;
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 400 "), "{head}");
        assert!(head.contains("Content-Type: application/json"), "{head}");
        let error: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(error["code"], "invalid_request");
    }
}

#[test]
fn unusable_certificates_are_clear_errors_at_start_and_in_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "good", false);
    let (other_cert, other_key) = ca.leaf(dir.path(), "other", false);
    let (expired_cert, expired_key) = ca.leaf(dir.path(), "expired", true);
    let _ = other_cert;
    let missing = dir.path().join("missing.crt");
    let cut = dir.path().join("cut.crt");
    let pem = std::fs::read(&cert).unwrap();
    let end = pem.windows(8).position(|w| w == b"-----END").unwrap();
    std::fs::write(&cut, &pem[..end]).unwrap();
    let cases: [(&Path, &Path, &str, &Path); 5] = [
        (
            &cut,
            &key,
            "it is cut off: no -----END CERTIFICATE----- line",
            &cut,
        ),
        (&missing, &key, "cannot read it", &missing),
        (
            &cert,
            &other_key,
            "does not belong to the certificate",
            &other_key,
        ),
        (&expired_cert, &expired_key, "expired on", &expired_cert),
        (&key, &key, "no certificate in it", &key),
    ];
    for (cert, key, why, file) in cases {
        let tls = free_addr().to_string();
        let data = dir.path().join("data");
        let started = Instant::now();
        let (code, _, stderr) = cli(&[
            "gateway",
            "--config",
            shipped_config().to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
            "--listen",
            &free_addr().to_string(),
            "--admin-listen",
            &free_addr().to_string(),
            "--tls-listen",
            &tls,
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ]);
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(code, 1, "{why}: {stderr}");
        assert!(
            stderr.contains(why) && stderr.contains(file.to_str().unwrap()),
            "{why}: {stderr}"
        );
        let config = dir.path().join("tls.toml");
        std::fs::write(
            &config,
            format!(
                "[gateway.tls]\nlisten = \"{tls}\"\ncert = \"{}\"\nkey = \"{}\"\n",
                cert.display(),
                key.display()
            ),
        )
        .unwrap();
        let (code, _, stderr) = cli(&["check-config", config.to_str().unwrap()]);
        assert_eq!(code, 1, "check-config, {why}: {stderr}");
        assert!(
            stderr.contains(why) && stderr.contains(file.to_str().unwrap()),
            "{stderr}"
        );
    }
    let half = dir.path().join("half.toml");
    std::fs::write(&half, "[gateway.tls]\nlisten = \"127.0.0.1:1\"\n").unwrap();
    let (code, _, stderr) = cli(&["check-config", half.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(stderr.contains("gateway.tls"), "{stderr}");
}

#[tokio::test]
async fn sighup_swaps_the_certificate_without_dropping_connections() {
    let dir = tempfile::tempdir().unwrap();
    let (old_ca, new_ca) = (TestCa::new(), TestCa::new());
    let (cert, key) = old_ca.leaf(dir.path(), "server", false);
    let (stack, tls) = tls_stack(dir.path(), &cert, &key);
    let url = format!("https://localhost:{}/v1/pets", tls.port());
    let api_key = stack.key(&["--plan", "pro"]);
    let old = old_ca.client(false);
    assert_eq!(
        old.get(&url)
            .bearer_auth(&api_key)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert!(
        new_ca.client(false).get(&url).send().await.is_err(),
        "not trusted yet"
    );

    // New files in place, then SIGHUP.
    let (new_cert, new_key) = new_ca.leaf(dir.path(), "next", false);
    std::fs::copy(&new_cert, &cert).unwrap();
    std::fs::copy(&new_key, &key).unwrap();
    kill(stack.proc.pid(), Signal::SIGHUP).unwrap();
    stack.proc.wait_log("configuration reloaded");
    let fresh = new_ca.client(false);
    assert_eq!(
        fresh
            .get(&url)
            .bearer_auth(&api_key)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // The connection made before the reload is still open and still served: a new one would
    // be refused, since this client trusts only the old CA.
    assert_eq!(
        old.get(&url)
            .bearer_auth(&api_key)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    // A damaged file on SIGHUP changes nothing and is counted.
    std::fs::write(&cert, "not a certificate").unwrap();
    kill(stack.proc.pid(), Signal::SIGHUP).unwrap();
    stack.proc.wait_log("the configuration was refused");
    assert_eq!(
        metric(stack.admin, "gateway_reloads_total{result=\"error\"}"),
        Some(1.0)
    );
    assert_eq!(
        new_ca
            .client(false)
            .get(&url)
            .bearer_auth(&api_key)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

/// A route with `tls = true` reaches its upstream over HTTPS, verified against the configured
/// CA, with the post-quantum key exchange when the upstream has it and without a second
/// ClientHello when it has not; an upstream whose
/// certificate the CA did not sign gets 502, never a silent pass.
#[tokio::test]
async fn a_route_with_tls_speaks_https_to_its_upstream_and_verifies_it() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, stranger) = (TestCa::new(), TestCa::new());
    let trusted = common::TestUpstream::start_tls(ca.acceptor(dir.path())).await;
    // An upstream on rustls with ring, which has no post-quantum group and, as every rustls
    // server, takes the first group of the client's list it has.
    #[allow(deprecated)]
    let ring = std::sync::Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let classic = common::TestUpstream::start_tls(ca.acceptor_on(dir.path(), ring)).await;
    let unknown = common::TestUpstream::start_tls(stranger.acceptor(dir.path())).await;
    let ca_file = ca.write_pem(dir.path());
    let route = |prefix: &str, addr: SocketAddr| {
        format!(
            "[[gateway.routes]]\nprefix = \"{prefix}\"\nupstream = \"{addr}\"\ntls = true\nsni = \"localhost\"\nca = \"{}\"\n",
            ca_file.display()
        )
    };
    let stack = Stack::start_with_text(
        dir.path(),
        &format!(
            "{}{}{}{}",
            common::PETS_ROUTE,
            route("/v1/secure", trusted.addr),
            route("/v1/classic", classic.addr),
            route("/v1/impostor", unknown.addr)
        ),
    );
    let key = stack.key(&["--plan", "pro"]);
    let c = client();
    let r = stack.get(&c, "/v1/secure/orders", &key).await;
    assert_eq!(r.status(), 200);
    let echo: serde_json::Value = r.json().await.unwrap();
    assert_eq!(echo["path"], "/v1/secure/orders");
    assert_eq!(trusted.hits(), 1);
    // The gateway's connector offers the post-quantum group first too, and this upstream has it;
    // one without it finds X25519 next, whose key share came with the first ClientHello.
    assert_eq!(
        trusted.key_exchange_groups(),
        ["Some(X25519MLKEM768) Some(Full)"]
    );
    let r = stack.get(&c, "/v1/classic/orders", &key).await;
    assert_eq!(r.status(), 200);
    assert_eq!(classic.key_exchange_groups(), ["Some(X25519) Some(Full)"]);
    assert_error(
        stack.get(&c, "/v1/impostor/x", &key).await,
        502,
        "bad_gateway",
    )
    .await;
    assert_eq!(
        unknown.hits(),
        0,
        "nothing was sent to an unverified upstream"
    );
}

/// Over HTTPS/1.1 a connection is bounded as over plain HTTP: a request head trickled for longer
/// than `gateway.header_timeout_seconds` is closed, however steadily it comes, and a connection
/// silent after its handshake goes at the keep-alive timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_heads_and_silent_connections_over_https_are_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let config = dir.path().join("short-timeouts.toml");
    let shipped = std::fs::read_to_string(shipped_config()).unwrap();
    let short = shipped
        .replace(
            "keepalive_timeout_seconds = 60",
            "keepalive_timeout_seconds = 3",
        )
        .replace("header_timeout_seconds = 10", "header_timeout_seconds = 1");
    assert_ne!(short, shipped, "the shipped timeouts moved");
    std::fs::write(&config, short).unwrap();
    let (stack, tls) = Stack::start_tls(dir.path(), &config, &cert, &key);
    let api_key = stack.key(&["--plan", "pro"]);
    let silent = ca.connect_http1(tls).await;

    let mut slow = ca.connect_http1(tls).await;
    let head =
        format!("GET /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {api_key}\r\n\r\n");
    let closed_after = common::trickle_until_closed(&mut slow, head.as_bytes()).await;
    common::assert_closed_at_header_timeout(closed_after, stack.admin);
    let mut buf = [0u8; 256];

    // The same head sent at once is answered, and the connection stays open for more.
    let mut quick = ca.connect_http1(tls).await;
    for _ in 0..2 {
        quick.write_all(head.as_bytes()).await.unwrap();
        let n = quick.read(&mut buf).await.unwrap();
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&buf[..n])
        );
        let mut rest = vec![0u8; 4096];
        let _ = tokio::time::timeout(Duration::from_millis(200), quick.read(&mut rest)).await;
    }

    // The connection that sent nothing after its handshake goes at the keep-alive timeout.
    let admin = stack.admin;
    tokio::task::spawn_blocking(move || {
        wait_metric(
            admin,
            "gateway_client_timeouts_total{phase=\"idle\"}",
            Duration::from_secs(10),
            |v| v >= 1.0,
        )
    })
    .await
    .unwrap();
    let mut silent = silent;
    let read = tokio::time::timeout(Duration::from_secs(2), silent.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the silent connection is still open: {read:?}"
    );
}

/// HTTP/2 clients that go away with requests in flight, by cancelling their streams or by
/// closing the connection, are no failure: nothing is logged above debug and each request
/// counts as `client_closed`, as over HTTP/1.1 (`tests/gateway_routing/connections.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_that_go_away_mid_request_are_counted_not_logged() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let slow = common::TestUpstream::start(Duration::from_secs(1)).await;
    let routes = format!(
        "{}\n[[gateway.routes]]\nprefix = \"/v1/store/orders\"\nupstream = \"{}\"\ntimeout_ms = 10000\n",
        common::PETS_ROUTE,
        slow.addr
    );
    let config = Stack::config_with_text(dir.path(), &routes);
    let (stack, tls) = Stack::start_tls(dir.path(), &config, &cert, &key);
    let api_key = stack.key(&["--plan", "pro"]);

    // Two connections with five requests each: the first cancels its streams, the second is
    // closed with its streams open.
    for close_connection in [false, true] {
        let stream = ca.connect(tls, b"h2").await;
        let (mut send, connection) = h2::client::handshake(stream).await.unwrap();
        let driver = tokio::spawn(connection);
        let mut pending = Vec::new();
        for _ in 0..5 {
            let request = http::Request::get(format!(
                "https://localhost:{}/v1/store/orders/1",
                tls.port()
            ))
            .header("authorization", format!("Bearer {api_key}"))
            .body(())
            .unwrap();
            send = send.ready().await.unwrap();
            let (response, _) = send.send_request(request, true).unwrap();
            pending.push(response);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        if close_connection {
            driver.abort();
        }
        drop(pending);
        tokio::time::sleep(Duration::from_millis(100)).await;
        driver.abort();
    }
    common::wait_client_closed(stack.admin, "/v1/store/orders", 10.0).await;
    let log = stack.proc.log_text();
    assert!(!log.contains(" WARN ") && !log.contains(" ERROR "), "{log}");
}

/// An HTTP/2 client that cancels its stream while the upstream is still working is let go at
/// once, as an HTTP/1.1 client that closes its connection is (`tests/gateway_routing/connections.rs`): the
/// gateway reads the stream's reset while it waits for the upstream and closes the upstream
/// connection without waiting for an answer or the route's 30 s timeout; the client's
/// connection goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_cancelled_while_the_upstream_works_is_let_go_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let (upstream, head_read, seen) = common::silent_upstream();
    let routes = format!(
        "{}\n[[gateway.routes]]\nprefix = \"/v1/store\"\nupstream = \"{upstream}\"\ntimeout_ms = 30000\n",
        common::PETS_ROUTE,
    );
    let config = Stack::config_with_text(dir.path(), &routes);
    let (stack, tls) = Stack::start_tls(dir.path(), &config, &cert, &key);
    let api_key = stack.key(&["--plan", "pro"]);

    let stream = ca.connect(tls, b"h2").await;
    let (send, connection) = h2::client::handshake(stream).await.unwrap();
    let driver = tokio::spawn(connection);
    let get = |path: &str| {
        http::Request::get(format!("https://localhost:{}{path}", tls.port()))
            .header("authorization", format!("Bearer {api_key}"))
            .body(())
            .unwrap()
    };
    let mut send = send.ready().await.unwrap();
    let (response, _) = send.send_request(get("/v1/store/orders"), true).unwrap();
    tokio::task::spawn_blocking(move || head_read.recv_timeout(Duration::from_secs(10)))
        .await
        .unwrap()
        .unwrap();
    drop(response);
    let seen = tokio::task::spawn_blocking(move || seen.recv_timeout(Duration::from_secs(15)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen, "closed");
    common::wait_client_closed(stack.admin, "/v1/store", 1.0).await;

    // The connection serves the next request.
    let mut send = send.ready().await.unwrap();
    let (response, _) = send.send_request(get("/v1/pets"), true).unwrap();
    assert_eq!(response.await.unwrap().status(), 200);
    driver.abort();
}
