//! What the API offers its clients beyond the pets: `GET /v1/rate_limit` and CORS for browser
//! apps, through the real binary.

mod common;

use common::{PETS_ROUTE, Stack, assert_error, client, key_id, unix_now};
use reqwest::Method;
use serde_json::Value;

async fn standing(
    stack: &Stack,
    c: &reqwest::Client,
    key: &str,
) -> (reqwest::header::HeaderMap, Value) {
    let r = stack.get(c, "/v1/rate_limit", key).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    let headers = r.headers().clone();
    (headers, r.json().await.unwrap())
}

fn remaining(headers: &reqwest::header::HeaderMap) -> u64 {
    headers["x-ratelimit-remaining"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn rate_limit_tells_where_a_key_stands_and_counts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let c = client();

    // A fresh key: everything left; reading it again changes nothing.
    let key = stack.key(&["--plan", "pro"]);
    let midnight = (unix_now() / 86_400 + 1) * 86_400;
    for _ in 0..3 {
        // A fresh key's minute would start with its next request: 60 s from when it is asked,
        // which on a busy machine may be a second or more after `before`.
        let before = unix_now();
        let (headers, body) = standing(&stack, &c, &key).await;
        let after = unix_now();
        assert_eq!(body["key_id"], key_id(&key));
        assert_eq!(body["plan"], "pro");
        assert_eq!(body["minute"]["limit"], 300);
        assert_eq!(body["minute"]["remaining"], 300);
        let reset = body["minute"]["reset"].as_u64().unwrap();
        assert!(
            (before + 59..=after + 61).contains(&reset),
            "{before} {after} {body}"
        );
        assert_eq!(body["day"]["limit"], 10_000);
        assert_eq!(body["day"]["remaining"], 10_000);
        assert_eq!(body["day"]["reset"], midnight);
        assert_eq!(body["banned_until"], Value::Null);
        assert_eq!(remaining(&headers), 300);
        assert!(headers.contains_key("ratelimit-policy") && headers.contains_key("x-request-id"));
    }

    // After some requests: both windows count them.
    for _ in 0..3 {
        assert_eq!(stack.get(&c, "/v1/pets", &key).await.status(), 200);
    }
    let (headers, body) = standing(&stack, &c, &key).await;
    assert_eq!(
        (
            body["minute"]["remaining"].as_u64(),
            body["day"]["remaining"].as_u64()
        ),
        (Some(297), Some(9_997))
    );
    assert_eq!(remaining(&headers), 297);

    // While rate limited: still answered, with nothing left in the minute.
    let tight = stack.enterprise_key(2, 1000);
    for _ in 0..2 {
        assert_eq!(stack.get(&c, "/v1/pets", &tight).await.status(), 200);
    }
    assert_error(stack.get(&c, "/v1/pets", &tight).await, 429, "rate_limited").await;
    let (headers, body) = standing(&stack, &c, &tight).await;
    assert_eq!(body["plan"], "enterprise");
    assert_eq!(
        (
            body["minute"]["limit"].as_u64(),
            body["minute"]["remaining"].as_u64()
        ),
        (Some(2), Some(0))
    );
    assert_eq!(body["day"]["remaining"], 998);
    assert_eq!(remaining(&headers), 0);

    // While banned: the ban's end, and the headers describe it.
    let banned = stack.enterprise_key(1, 1000);
    assert_eq!(stack.get(&c, "/v1/pets", &banned).await.status(), 200);
    for _ in 0..11 {
        stack.get(&c, "/v1/pets", &banned).await;
    }
    let (headers, body) = standing(&stack, &c, &banned).await;
    let until = body["banned_until"].as_u64().expect("banned");
    assert!(
        (unix_now() + 890..=unix_now() + 901).contains(&until),
        "{body}"
    );
    assert_eq!(remaining(&headers), 0);
    assert_eq!(
        headers["x-ratelimit-reset"].to_str().unwrap(),
        until.to_string()
    );

    // A bad key spends the address's failed-auth budget like any other request.
    let r = stack
        .get(&c, "/v1/rate_limit", "as_0000000000000000_nope")
        .await;
    assert_eq!(r.headers()["ratelimit-policy"], "\"failed-auth\";q=60;w=60");
    assert_eq!(remaining(r.headers()), 59);
    assert_error(r, 401, "unauthorized").await;
    let r = stack
        .get(&c, "/v1/rate_limit", "as_0000000000000000_nope")
        .await;
    assert_eq!(remaining(r.headers()), 58);

    // Only GET.
    let r = c
        .post(stack.url("/v1/rate_limit"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["allow"], "GET, HEAD");
    assert_error(r, 405, "method_not_allowed").await;
    let (_, body) = standing(&stack, &c, &key).await;
    assert_eq!(body["minute"]["remaining"], 297, "none of that was counted");
}

const APP: &str = "https://app.example";

fn cors_config(route_extra: &str) -> String {
    format!(
        "[gateway.cors]\nallowed_origins = [\"{APP}\"]\nmax_age_seconds = 120\n{PETS_ROUTE}\n[[gateway.routes]]\nprefix = \"/v1/private\"\nupstream = \"backend\"\n{route_extra}"
    )
}

#[tokio::test]
async fn cors_answers_preflights_itself_and_exposes_the_limit_headers_to_allowed_origins() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start_with_text(
        dir.path(),
        &cors_config("[gateway.routes.cors]\nallowed_origins = []\n"),
    );
    let key = stack.key(&["--plan", "pro"]);
    let c = client();
    let preflight = |origin: &str, path: &str| {
        c.request(Method::OPTIONS, stack.url(path))
            .header("Origin", origin)
            .header("Access-Control-Request-Method", "POST")
            .header(
                "Access-Control-Request-Headers",
                "authorization, content-type, idempotency-key",
            )
            .send()
    };

    // A preflight from an allowed origin: answered by the gateway, no key, nothing counted.
    let r = preflight(APP, "/v1/pets").await.unwrap();
    assert_eq!(r.status(), 204);
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], APP);
    assert!(
        h["access-control-allow-methods"]
            .to_str()
            .unwrap()
            .contains("POST")
    );
    let allowed = h["access-control-allow-headers"].to_str().unwrap();
    for name in ["Authorization", "Content-Type", "Idempotency-Key"] {
        assert!(allowed.contains(name), "{allowed}");
    }
    assert_eq!(h["access-control-max-age"], "120");
    assert_eq!(h["vary"], "Origin");
    assert_eq!(
        h["x-ratelimit-remaining"], "60",
        "the address's budget, untouched"
    );
    assert!(!h.contains_key("content-length") || h["content-length"] == "0");

    // Other origins get no CORS headers, but `Vary: Origin` (a cache must not serve their
    // answer to the app); a route that turned CORS off gets neither.
    let r = preflight("https://evil.example", "/v1/pets").await.unwrap();
    assert_eq!(r.status(), 204);
    assert!(!r.headers().contains_key("access-control-allow-origin"));
    assert_eq!(r.headers()["vary"], "Origin");
    let r = preflight(APP, "/v1/private/x").await.unwrap();
    assert!(!r.headers().contains_key("access-control-allow-origin"));
    assert!(!r.headers().contains_key("vary"));

    // Real requests from the allowed origin: the CORS headers on success and on refusals, and
    // the limit headers exposed to the page.
    let get = |origin: &'static str, key: &str| {
        c.get(stack.url("/v1/pets"))
            .bearer_auth(key)
            .header("Origin", origin)
            .send()
    };
    let r = get(APP, &key).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["access-control-allow-origin"], APP);
    assert_eq!(r.headers()["vary"], "Origin");
    assert_eq!(
        r.headers()["x-ratelimit-remaining"],
        "299",
        "counted as usual"
    );
    let exposed = r.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap();
    for name in [
        "X-RateLimit-Remaining",
        "X-RateLimit-Reset",
        "X-RateLimit-Limit",
        "RateLimit",
        "Retry-After",
        "Link",
        "Deprecation",
        "Sunset",
        "Location",
        "X-Request-Id",
    ] {
        assert!(exposed.contains(name), "{name} in {exposed}");
    }
    let r = get(APP, "as_0000000000000000_bad").await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["access-control-allow-origin"], APP);
    let one = stack.enterprise_key(1, 100);
    get(APP, &one).await.unwrap();
    let r = get(APP, &one).await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        APP,
        "a page can read its Retry-After"
    );
    let r = get("https://evil.example", &key).await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(!r.headers().contains_key("access-control-allow-origin"));
    assert!(!r.headers().contains_key("access-control-expose-headers"));
    assert_eq!(r.headers()["vary"], "Origin");

    // Without `Origin` (a script, a navigation) the answer has no CORS headers; a browser may
    // cache it, so it too says that it depends on `Origin`. So do the public pages.
    for path in ["/v1/pets", "/v1/openapi.yaml"] {
        let r = c
            .get(stack.url(path))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert!(!r.headers().contains_key("access-control-allow-origin"));
        assert_eq!(r.headers()["vary"], "Origin", "{path}");
    }
}

#[tokio::test]
async fn without_cors_configured_a_preflight_is_an_ordinary_unauthenticated_request() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let r = client()
        .request(Method::OPTIONS, stack.url("/v1/pets"))
        .header("Origin", APP)
        .header("Access-Control-Request-Method", "GET")
        .send()
        .await
        .unwrap();
    assert!(!r.headers().contains_key("access-control-allow-origin"));
    assert!(!r.headers().contains_key("vary"), "CORS is off");
    assert_error(r, 401, "unauthorized").await;
}
