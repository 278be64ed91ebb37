//! What pingora refuses before any hook of the gateway runs: the contract's answers in place of
//! its bare ones.

use super::*;

/// Requests pingora refuses before any hook of the gateway runs (it cannot parse them, or they
/// are `CONNECT`) get the contract's JSON error, not pingora's empty answer, with the rate-limit
/// headers of every response (the address's failed-authentication budget, as for any request
/// without a valid key, which they do not spend), and are counted.
#[test]
fn requests_the_parser_refuses_get_the_contract_error() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "pro"]);
    let get = format!("GET /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n");
    let close = |request: &str| request.replace("\r\n\r\n", "\r\nConnection: close\r\n\r\n");

    // One failed authentication first: the refusals describe the budget it left.
    let (status, headers, body) = raw_http(
        stack.listen,
        close(&get.replace("Authorization: Bearer", "X-No:")).as_bytes(),
    );
    assert_eq!(status, 401);
    assert!(body.contains("\"unauthorized\""), "{body}");
    let budget = |headers: &[(String, String)]| {
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "ratelimit-policy",
        ]
        .map(|name| header(headers, name).map(str::to_owned))
    };
    let after_failure = budget(&headers);
    let limit: u64 = after_failure[0].as_deref().unwrap().parse().unwrap();
    assert_eq!(
        after_failure[1].as_deref(),
        Some((limit - 1).to_string().as_str())
    );
    let unparsable = [
        "NONSENSE\r\n\r\n".to_owned(),
        "GET /v1/pets HTTP/1.1\r\nHost: x\r\nX-Bad: \x01\r\n\r\n".to_owned(),
        "GET /v1/pets HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"
            .to_owned(),
        "GET /v1/pets HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n".to_owned(),
        // Behind a request that is answered: that answer first, then the refusal.
        format!("{get}NONSENSE\r\n\r\n"),
    ];
    for request in &unparsable {
        let (status, headers, body) = raw_http(stack.listen, request.as_bytes());
        let body = body
            .rsplit_once("HTTP/1.1 400 ")
            .map_or(body.as_str(), |(_, b)| b);
        let body = body.split_once("\r\n\r\n").map_or(body, |(_, b)| b);
        let error: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
        assert_eq!(error["code"], "invalid_request", "{request:?}");
        assert_eq!(error["status"], 400);
        if request.starts_with("GET /v1/pets HTTP/1.1\r\nHost: x\r\nAuthorization") {
            assert_eq!(status, 200, "the request before it is answered first");
        } else {
            assert_eq!(status, 400, "{request:?}");
            assert_eq!(header(&headers, "content-type"), Some("application/json"));
            assert_eq!(header(&headers, "connection"), Some("close"));
            assert_eq!(header(&headers, "x-request-id").map(str::len), Some(24));
            assert_eq!(budget(&headers), after_failure, "{request:?}");
            assert!(
                header(&headers, "ratelimit").is_some_and(|r| r.starts_with("\"failed-auth\";r=")),
                "{headers:?}"
            );
        }
    }
    let (status, headers, body) = raw_http(
        stack.listen,
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    );
    assert_eq!(status, 405);
    assert_eq!(header(&headers, "allow"), Some(""));
    assert_eq!(budget(&headers), after_failure);
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["code"], "method_not_allowed");

    // Answers of the gateway and of the upstream, 400 and 405 among them, are untouched; the
    // connection's next request is served; the refusals are counted.
    let (status, _, body) = raw_http(
        stack.listen,
        close(&get.replace("/v1/pets", "/v1/pets/../pets")).as_bytes(),
    );
    assert_eq!(status, 400);
    assert!(
        body.contains("`.` or `..` segments"),
        "the gateway's own 400: {body}"
    );
    let (status, headers, _) = raw_http(
        stack.listen,
        close(&get.replace("GET /v1/pets", "DELETE /v1/pets")).as_bytes(),
    );
    assert_eq!(status, 405);
    assert_eq!(
        header(&headers, "allow"),
        Some("GET, HEAD, POST"),
        "the backend's own 405"
    );
    let (status, _, rest) = raw_http(stack.listen, format!("{get}{}", close(&get)).as_bytes());
    assert_eq!(status, 200);
    assert!(
        rest.contains("HTTP/1.1 200 OK\r\n"),
        "the second answered too: {rest}"
    );
    let refused = |status: &str, code: &str| {
        metric(
            stack.admin,
            &format!(
                "gateway_responses_total{{method=\"other\",outcome=\"{code}\",route=\"none\",status=\"{status}\"}}"
            ),
        )
    };
    assert_eq!(
        refused("400", "invalid_request"),
        Some(unparsable.len() as f64)
    );
    assert_eq!(refused("405", "method_not_allowed"), Some(1.0));

    // The admin listener answers what it cannot parse too (its valid requests are tested with
    // its paths).
    let (status, headers, body) = raw_http(stack.admin, b"NONSENSE\r\n\r\n");
    assert_eq!(status, 400, "{body}");
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    let error: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
    assert_eq!(error["code"], "invalid_request");
}
