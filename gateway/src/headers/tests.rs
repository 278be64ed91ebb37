//! Unit tests of [`super`] (`headers.rs`).

use super::*;
use crate::rate_headers::RateHeaders;

#[test]
fn every_name_is_parsed_from_its_documented_text() {
    for name in [
        X_RATELIMIT_LIMIT,
        X_RATELIMIT_REMAINING,
        X_RATELIMIT_RESET,
        RATELIMIT_POLICY,
        RATELIMIT,
        X_REQUEST_ID,
        X_FORWARDED_FOR,
        X_API_KEY_ID,
        X_API_PLAN,
    ] {
        assert_eq!(name.parsed.as_str(), name.cased.to_ascii_lowercase());
        // What `Message::may_hold_ours` looks for.
        assert!(matches!(name.parsed.as_str().as_bytes()[0], b'x' | b'r'));
    }
}

/// A request to `target` with a client's header, given the gateway's header in lowercase
/// mode: its target and header lines as they would go upstream.
fn lowercased(target: &[u8], version: http::Version) -> (Vec<u8>, String) {
    let mut request = RequestHeader::build("GET", target, None).unwrap();
    request.set_version(version);
    request.insert_header("X-Client-Thing", "1").unwrap();
    with_request_headers(&mut request, HeaderCase::Lower, |h| {
        h.insert(&X_API_PLAN, HeaderValue::from_static("free"));
    });
    let mut wire = Vec::new();
    request.header_to_h1_wire(&mut wire);
    (
        request.raw_path().to_vec(),
        String::from_utf8(wire).unwrap(),
    )
}

#[test]
fn a_request_whose_target_is_not_its_uri_keeps_its_form() {
    // Absolute-form: the target goes upstream as received, so pingora's form is kept.
    let (target, wire) = lowercased(b"http://example.test/v1/pets", http::Version::HTTP_11);
    assert_eq!(target, b"http://example.test/v1/pets");
    assert!(
        wire.contains("X-Client-Thing: 1") && wire.contains("X-Api-Plan: free"),
        "{wire}"
    );
    // HTTP/2: pingora's form too, whatever the target.
    let (target, wire) = lowercased(b"/v1/pets?x=1", http::Version::HTTP_2);
    assert_eq!(target, b"/v1/pets?x=1");
    assert!(
        wire.contains("X-Client-Thing: 1") && wire.contains("X-Api-Plan: free"),
        "{wire}"
    );
    let (target, wire) = lowercased(b"/v1/pets?x=1", http::Version::HTTP_11);
    assert_eq!(target, b"/v1/pets?x=1");
    assert!(
        wire.contains("x-client-thing: 1") && wire.contains("x-api-plan: free"),
        "{wire}"
    );
}

#[test]
fn owned_values_no_longer_share_the_buffer_they_were_read_into() {
    let head = Bytes::from(b"application/json secret".repeat(100));
    let within = |v: &HeaderValue| head.as_ptr_range().contains(&v.as_bytes().as_ptr());
    let mut map = HeaderMap::new();
    map.insert(
        "content-type",
        HeaderValue::from_maybe_shared(head.slice(0..16)).unwrap(),
    );
    let mut secret = HeaderValue::from_maybe_shared(head.slice(17..23)).unwrap();
    secret.set_sensitive(true);
    map.insert("x-secret", secret);
    assert!(map.values().all(within));

    own_values(&mut map);
    assert!(!map.values().any(within));
    assert_eq!(map["content-type"], "application/json");
    assert_eq!(map["x-secret"], "secret");
    assert!(map["x-secret"].is_sensitive());
}

/// A context whose request was counted against a minute's window.
fn counted() -> Ctx {
    let config: crate::config::GatewayConfig = toml::from_str("").unwrap();
    let settings = crate::settings::Settings::new(&config, "127.0.0.1:8081".parse().unwrap());
    let mut ctx = Ctx::new(std::sync::Arc::new(settings.unwrap()));
    ctx.now_ms = 90_000;
    ctx.rate = Some(RateHeaders {
        name: "minute",
        limit: 60,
        remaining: 59,
        reset_ms: 120_000,
        policy: HeaderValue::from_static("\"minute\";q=60;w=60"),
    });
    ctx
}

#[test]
fn only_the_values_unique_to_a_response_are_kept_out_of_hpack_tables() {
    let ctx = counted();
    let mut response = ResponseHeader::build(200, None).unwrap();
    response
        .insert_header("Content-Type", "application/json")
        .unwrap();
    decorate(&mut response, &ctx, true).unwrap();
    let mut never_indexed: Vec<&str> = response
        .headers
        .iter()
        .filter(|(_, v)| v.is_sensitive())
        .map(|(n, _)| n.as_str())
        .collect();
    never_indexed.sort();
    assert_eq!(
        never_indexed,
        ["ratelimit", "x-ratelimit-remaining", "x-request-id"]
    );
    assert_eq!(response.headers.len(), 7);
    assert_eq!(response.headers["x-ratelimit-remaining"], "59");
    assert_eq!(response.headers["ratelimit"], "\"minute\";r=59;t=30");
    assert_eq!(response.headers["x-request-id"], ctx.request_id.as_str());
}

/// An upstream's response with `fields`, decorated for `ctx` over HTTP/1.1: the response,
/// and its head as written.
fn decorated_h1(ctx: &Ctx, fields: &[(&'static str, &'static str)]) -> (ResponseHeader, String) {
    let mut response = ResponseHeader::build(200, None).unwrap();
    for &(name, value) in fields {
        response.append_header(name, value).unwrap();
    }
    decorate(&mut response, ctx, false).unwrap();
    let mut wire = Vec::new();
    response.header_to_h1_wire(&mut wire);
    (response, String::from_utf8(wire).unwrap())
}

#[test]
fn an_http1_response_carries_the_gateways_values_once_in_their_documented_case() {
    let ctx = counted();
    let (response, wire) = decorated_h1(
        &ctx,
        &[
            ("Content-Type", "application/json"),
            ("x-request-id", "from-the-upstream"),
            ("X-RATELIMIT-LIMIT", "5"),
            ("X-Upstream-Thing", "kept"),
        ],
    );
    let id = ctx.request_id.as_str();
    assert_eq!(
        wire,
        format!(
            "Content-Type: application/json\r\nX-Upstream-Thing: kept\r\n\
                 X-RateLimit-Limit: 60\r\nX-RateLimit-Remaining: 59\r\nX-RateLimit-Reset: 120\r\n\
                 RateLimit-Policy: \"minute\";q=60;w=60\r\nRateLimit: \"minute\";r=59;t=30\r\n\
                 X-Request-Id: {id}\r\n"
        )
    );
    // A copy (pingora clones a response it may write again) writes the same head.
    let mut again = Vec::new();
    response.clone().header_to_h1_wire(&mut again);
    assert_eq!(String::from_utf8(again).unwrap(), wire);
}

#[test]
fn an_upstreams_ratelimit_fields_alone_are_replaced_too() {
    // No name of the message begins with `x`: the `RateLimit` fields must still be found.
    let (_, wire) = decorated_h1(
        &counted(),
        &[
            ("Content-Type", "application/json"),
            ("RateLimit-Policy", "\"upstream\";q=1"),
            ("ratelimit", "\"upstream\";r=0"),
        ],
    );
    assert!(!wire.contains("upstream"), "{wire}");
    assert_eq!(wire.matches("RateLimit-Policy: ").count(), 1, "{wire}");
    assert_eq!(wire.matches("RateLimit: ").count(), 1, "{wire}");
}

#[test]
fn a_request_upstream_carries_the_gateways_values_in_place_of_the_clients() {
    let mut request = RequestHeader::build("GET", b"/v1/pets", None).unwrap();
    request.append_header("Host", "store.test").unwrap();
    request
        .append_header("X-Forwarded-For", "192.0.2.1")
        .unwrap();
    request.append_header("x-api-plan", "enterprise").unwrap();
    with_request_headers(&mut request, HeaderCase::Preserve, |h| {
        h.insert(&X_FORWARDED_FOR, HeaderValue::from_static("198.51.100.7"));
        h.insert(&X_API_PLAN, HeaderValue::from_static("free"));
    });
    let mut wire = Vec::new();
    request.header_to_h1_wire(&mut wire);
    assert_eq!(
        String::from_utf8(wire).unwrap(),
        "Host: store.test\r\nX-Forwarded-For: 198.51.100.7\r\nX-Api-Plan: free\r\n"
    );
}

#[test]
fn values_render_as_the_draft_and_the_x_headers_say() {
    assert_eq!(value_of(&[Piece::Number(0)], false), "0");
    let max = value_of(&[Piece::Number(u64::MAX)], true);
    assert_eq!(max, u64::MAX.to_string().as_str());
    assert!(max.is_sensitive());
    // A value with no bound on its length (a trusted proxy's chain) is written on the heap.
    let chain = vec!["203.0.113.9"; 40].join(", ");
    let received = HeaderValue::from_str(&chain).unwrap();
    let proxies = crate::client::TrustedProxies::parse(&["10.0.0.0/8".to_owned()]).unwrap();
    let client = "198.51.100.4".parse().unwrap();
    let forwarded = proxies.forward("10.0.0.1".parse().unwrap(), client, Some(&received));
    assert_eq!(
        value_of(&[Piece::Forwarded(&forwarded)], false),
        format!("{chain}, 198.51.100.4").as_str()
    );
}
