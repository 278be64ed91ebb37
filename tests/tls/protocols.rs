//! What HTTPS speaks: HTTP/2 and HTTP/1.1 answering as plain HTTP does, the post-quantum key
//! exchange, large bodies on many HTTP/2 streams, `HEAD` over every protocol, an unparsable
//! request over HTTPS, and the scheme upstreams are told (`X-Forwarded-Proto`).

use super::*;

/// The contract's answers (200, 201, a deprecated 200, 401, 404, 413, 429) come with the same
/// statuses and headers over HTTP/2 and HTTP/1.1 with TLS as over plain HTTP.
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

/// An unparsable request, or one whose target has a space, gets the contract's JSON 400 over
/// HTTPS as over plain HTTP, with the rate-limit headers of the address's budget.
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
        assert!(head.contains("\r\nX-RateLimit-Remaining: "), "{head}");
        assert!(head.contains("\r\nRateLimit: \"failed-auth\";"), "{head}");
        let error: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(error["code"], "invalid_request");
    }
}

/// Upstream, `X-Forwarded-Proto` names the scheme the client used: `https` for a request that
/// came over TLS, by HTTP/2 or HTTP/1.1, `http` for one over plain HTTP, whatever the client
/// wrote in it (no proxy is trusted here).
#[tokio::test]
async fn upstreams_are_told_the_scheme_the_client_used() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let echo = common::TestUpstream::start(Duration::ZERO).await;
    let config = Stack::config_with_text(
        dir.path(),
        &format!(
            "{}\n[[gateway.routes]]\nprefix = \"/v1/echo\"\nupstream = \"{}\"\n",
            common::PETS_ROUTE,
            echo.addr
        ),
    );
    let (stack, tls) = Stack::start_tls(dir.path(), &config, &cert, &key);
    let api_key = stack.key(&["--plan", "pro"]);
    let https = format!("https://localhost:{}/v1/echo/x", tls.port());
    for (c, url, version, claimed, scheme) in [
        (ca.client(false), &https, Version::HTTP_2, "http", "https"),
        (ca.client(true), &https, Version::HTTP_11, "http", "https"),
        (
            client(),
            &stack.url("/v1/echo/x"),
            Version::HTTP_11,
            "https",
            "http",
        ),
    ] {
        let r = c
            .get(url.as_str())
            .bearer_auth(&api_key)
            .header("X-Forwarded-Proto", claimed)
            .send()
            .await
            .unwrap();
        assert_eq!((r.status().as_u16(), r.version()), (200, version), "{url}");
        let echo: serde_json::Value = r.json().await.unwrap();
        assert_eq!(
            echo["headers"]["x-forwarded-proto"], scheme,
            "{version:?} {url}"
        );
    }
}
