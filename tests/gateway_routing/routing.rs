//! Routes and what the gateway adds to them: a second upstream, deprecation and sunset,
//! upstreams unreachable, slow or down and back.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_upstream_is_one_configuration_entry_with_auth_limits_and_headers() {
    let dir = tempfile::tempdir().unwrap();
    let orders = TestUpstream::start(Duration::ZERO).await;
    let stack = Stack::start_with_text(dir.path(), &orders_route(&orders, ""));
    let key = stack.key(&["--plan", "free"]);
    let c = client();

    let r = c
        .get(stack.url("/v1/store/orders/7?expand=items"))
        .bearer_auth(&key)
        .header("X-Forwarded-For", "203.0.113.9")
        .header("X-Api-Plan", "enterprise")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let request_id = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(r.headers()["x-ratelimit-remaining"], "59");
    assert!(r.headers().get("deprecation").is_none());
    let echo: Value = r.json().await.unwrap();
    assert_eq!(echo["path"], "/v1/store/orders/7?expand=items");
    let seen = &echo["headers"];
    assert!(
        seen.get("authorization").is_none(),
        "the key is not forwarded: {seen}"
    );
    assert_eq!(seen["x-api-key-id"], key_id(&key));
    assert_eq!(seen["x-api-plan"], "free", "a client cannot claim a plan");
    assert_eq!(seen["x-request-id"], request_id.as_str());
    assert_eq!(
        seen["x-forwarded-for"], "127.0.0.1",
        "a client's X-Forwarded-For is not passed on"
    );

    // Without a key: 401 from the gateway, and the upstream never sees the request.
    let hits = orders.hits();
    let r = c.get(stack.url("/v1/store/orders/7")).send().await.unwrap();
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    assert_error(r, 401, "unauthorized").await;
    let r = c
        .get(stack.url("/v1/store/orders/7"))
        .bearer_auth("as_0000000000000000_00")
        .send()
        .await
        .unwrap();
    assert_error(r, 401, "unauthorized").await;
    assert_eq!(orders.hits(), hits);

    // Counts against the same key as the pets routes.
    let r = stack.get(&c, "/v1/pets", &key).await;
    assert_eq!(r.headers()["x-ratelimit-remaining"], "58");
    // No route: 404 from the gateway.
    let r = stack.get(&c, "/v1/store/inventory", &key).await;
    assert!(r.headers().get("x-ratelimit-limit").is_some());
    assert_error(r, 404, "not_found").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deprecation_headers_only_on_get_pet() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "pro"]);
    let c = client();
    let r = c
        .post(stack.url("/v1/pets"))
        .bearer_auth(&key)
        .json(&json!({"name": "Rex", "categoryId": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert!(r.headers().get("deprecation").is_none() && r.headers().get("sunset").is_none());
    let pet: Value = r.json().await.unwrap();
    for path in [
        format!("/v1/pets/{}", pet["id"]),
        "/v1/pets/424242".to_owned(),
        // The same operation spelled with a trailing slash (the backend answers 404 to it).
        format!("/v1/pets/{}/", pet["id"]),
    ] {
        let r = c
            .get(stack.url(&path))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["deprecation"], "@1764892800", "{path}");
        assert_eq!(r.headers()["sunset"], "Thu, 05 Dec 2030 00:00:00 GMT");
        let links = links(&r);
        assert!(
            links.contains(&"</v1/pets>; rel=\"successor-version\""),
            "{links:?}"
        );
        assert!(
            links.iter().any(|l| l.ends_with("; rel=\"deprecation\"")),
            "{links:?}"
        );
    }
    // Even the gateway's own refusals on that operation carry them.
    let r = c.get(stack.url("/v1/pets/1")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers().get("sunset").is_some());
    let r = stack.get(&c, "/v1/pets", &key).await;
    assert!(r.headers().get("deprecation").is_none() && r.headers().get("link").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_sunset_the_operation_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let past = PETS_ROUTE
        .replace("2030-12-05T00:00:00Z", "2021-01-01T00:00:00Z")
        .replace("2025-12-05T00:00:00Z", "2020-01-01T00:00:00Z");
    let stack = Stack::start_with_text(dir.path(), &past);
    let key = stack.key(&["--plan", "pro"]);
    let c = client();
    for path in ["/v1/pets/1", "/v1/pets/1/"] {
        let r = stack.get(&c, path, &key).await;
        assert_eq!(
            r.headers()["sunset"],
            "Fri, 01 Jan 2021 00:00:00 GMT",
            "{path}"
        );
        assert_error(r, 410, "gone").await;
    }
    assert_eq!(stack.get(&c, "/v1/pets", &key).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_sunset_a_route_configured_to_forward_keeps_forwarding() {
    let dir = tempfile::tempdir().unwrap();
    let past = PETS_ROUTE
        .replace("2030-12-05T00:00:00Z", "2021-01-01T00:00:00Z")
        .replace(
            "documentation = ",
            "after_sunset = \"forward\"\ndocumentation = ",
        );
    let stack = Stack::start_with_text(dir.path(), &past);
    let key = stack.key(&["--plan", "pro"]);
    let r = stack.get(&client(), "/v1/pets/1", &key).await;
    assert_eq!(r.headers()["sunset"], "Fri, 01 Jan 2021 00:00:00 GMT");
    assert_error(r, 404, "not_found").await; // forwarded: the backend has no pet 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_upstream_is_502_and_slow_upstream_is_504_while_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let slow = TestUpstream::start(Duration::from_secs(5)).await;
    let closed = common::free_addr();
    let routes = format!(
        "{}\n[[gateway.routes]]\nprefix = \"/v1/closed\"\nupstream = \"{closed}\"\n",
        orders_route(&slow, "timeout_ms = 500")
    );
    let stack = Stack::start_with_text(dir.path(), &routes);
    let key = stack.key(&["--plan", "pro"]);
    let c = client();

    let r = stack.get(&c, "/v1/closed/x", &key).await;
    assert!(r.headers().get("x-ratelimit-remaining").is_some());
    assert!(r.headers().get("x-request-id").is_some());
    assert_error(r, 502, "bad_gateway").await;

    let started = Instant::now();
    let slow_request = tokio::spawn({
        let (c, url, key) = (c.clone(), stack.url("/v1/store/orders/1"), key.clone());
        async move { c.get(url).bearer_auth(key).send().await.unwrap() }
    });
    // While that request waits on the slow upstream, others are served.
    let r = stack.get(&c, "/v1/pets", &key).await;
    assert_eq!(r.status(), 200);
    let r = slow_request.await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered at the 500 ms timeout, not after the upstream"
    );
    assert!(r.headers().get("x-ratelimit-limit").is_some());
    assert_error(r, 504, "gateway_timeout").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_down_gives_502_then_recovers() {
    let dir = tempfile::tempdir().unwrap();
    // The data directory `GatewayOnly::start` gives a gateway named "gw"; the backend shares it.
    let data = dir.path().join("gateway-gw");
    let config = common::shipped_config();
    let (code, key, _) = common::cli(&[
        "keys",
        "create",
        "--plan",
        "pro",
        "--data-dir",
        data.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ]);
    assert_eq!(code, 0);
    let key = key.trim().to_owned();
    let backend_addr = common::free_addr();
    let mut gateway = common::GatewayOnly::start(dir.path(), "gw", &config, backend_addr, &[]);
    let listen = gateway.listen;
    let c = client();
    let url = format!("http://{listen}/v1/pets");
    assert_error(
        c.get(&url).bearer_auth(&key).send().await.unwrap(),
        502,
        "bad_gateway",
    )
    .await;

    // Start the backend on the address the gateway points to: it recovers without a restart.
    let start_backend = |log: &str| {
        let mut backend = common::Proc::start(
            &[
                "backend",
                "--config",
                config.to_str().unwrap(),
                "--data-dir",
                data.to_str().unwrap(),
                "--backend-listen",
                &backend_addr.to_string(),
            ],
            dir.path().join(log),
        );
        common::wait_for_port(backend_addr, &mut backend.child);
        backend
    };
    let mut backend = start_backend("backend.log");
    assert_eq!(
        c.get(&url).bearer_auth(&key).send().await.unwrap().status(),
        200
    );
    backend.kill9();
    assert_error(
        c.get(&url).bearer_auth(&key).send().await.unwrap(),
        502,
        "bad_gateway",
    )
    .await;
    // Crashed and restarted: the gateway drops its dead pooled connections and recovers.
    let _backend = start_backend("backend-2.log");
    for _ in 0..5 {
        assert_eq!(
            c.get(&url).bearer_auth(&key).send().await.unwrap().status(),
            200
        );
    }
    assert_eq!(gateway.proc.terminate(), Some(0));
}
