//! The pets service over HTTP, through the real binary (`animal-store backend`): every status,
//! error code and header of the spec's and the contract's tables for pets.

mod common;

use std::collections::HashSet;

use common::{Backend, assert_error, client};
use serde_json::{Value, json};

async fn create(c: &reqwest::Client, b: &Backend, body: Value) -> Value {
    let r = c.post(b.url("/v1/pets")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 201, "create {body}");
    let location = r.headers()["location"].to_str().unwrap().to_owned();
    let pet: Value = r.json().await.unwrap();
    assert_eq!(location, format!("/v1/pets/{}", pet["id"]));
    pet
}

/// Every pet, by walking the `Link: rel="next"` headers from `first`.
async fn walk(c: &reqwest::Client, b: &Backend, first: &str) -> (Vec<Value>, usize) {
    common::walk_pets(c, &b.url(""), first, None).await
}

#[tokio::test]
async fn create_returns_the_pet_with_location_and_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let b = Backend::start(&dir.path().join("data"));
    let c = client();
    let pet = create(&c, &b, json!({"name": "Rex", "categoryId": 3})).await;
    assert_eq!(
        pet,
        json!({"id": pet["id"], "name": "Rex", "categoryId": 3, "status": "available"})
    );
    let sold = create(
        &c,
        &b,
        json!({"name": "Tom", "categoryId": 9223372036854775807i64, "status": "sold"}),
    )
    .await;
    assert_eq!(sold["status"], "sold");
    assert!(
        sold["id"].as_i64().unwrap() > pet["id"].as_i64().unwrap(),
        "ids increase"
    );

    let r = c
        .get(b.url(&format!("/v1/pets/{}", pet["id"])))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(r.json::<Value>().await.unwrap(), pet);
}

#[tokio::test]
async fn invalid_creates_are_refused_and_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let b = Backend::start(&dir.path().join("data"));
    let c = client();
    create(&c, &b, json!({"name": "Only", "categoryId": 1})).await;

    let json_cases: &[(&str, &str)] = &[
        (r#"{"categoryId":1}"#, "validation_failed"),
        (r#"{"name":"Rex"}"#, "validation_failed"),
        (r#"{"name":5,"categoryId":1}"#, "validation_failed"),
        (r#"{"name":"Rex","categoryId":"1"}"#, "validation_failed"),
        (r#"{"name":"Rex","categoryId":1.5}"#, "validation_failed"),
        (r#"{"name":"Rex","categoryId":0}"#, "validation_failed"),
        (
            r#"{"name":"Rex","categoryId":9223372036854775808}"#,
            "validation_failed",
        ),
        (r#"{"name":"","categoryId":1}"#, "validation_failed"),
        (r#"{"name":" \t ","categoryId":1}"#, "validation_failed"),
        (r#"{"name":"a\nb","categoryId":1}"#, "validation_failed"),
        (
            r#"{"name":"Rex","categoryId":1,"status":"lost"}"#,
            "validation_failed",
        ),
        (
            r#"{"name":"Rex","categoryId":1,"colour":"red"}"#,
            "validation_failed",
        ),
        (
            r#"{"name":"Rex","categoryId":1,"id":99}"#,
            "validation_failed",
        ),
        // Duplicate names: refused, not read as the last of them.
        (
            r#"{"name":"Rex","categoryId":1,"name":"Max"}"#,
            "validation_failed",
        ),
        (r#"{"name":"Rex","#, "invalid_json"),
        (r#"["Rex"]"#, "invalid_json"),
        ("", "invalid_json"),
    ];
    for (body, code) in json_cases {
        let r = c
            .post(b.url("/v1/pets"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let err = assert_error(r, 400, code).await;
        let message = err["message"].as_str().unwrap();
        if *code == "validation_failed" {
            let names_field = ["name", "categoryId", "status", "colour", "id"]
                .iter()
                .any(|f| message.contains(f));
            assert!(names_field, "message names the field: {message}");
        }
    }
    let long_name = "x".repeat(101);
    let r = c
        .post(b.url("/v1/pets"))
        .json(&json!({"name": long_name, "categoryId": 1}))
        .send()
        .await
        .unwrap();
    assert_error(r, 400, "validation_failed").await;

    // Wrong or missing content type: 415.
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let mut req = c
            .post(b.url("/v1/pets"))
            .body(r#"{"name":"Rex","categoryId":1}"#);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        assert_error(req.send().await.unwrap(), 415, "unsupported_media_type").await;
    }
    // Over 16 KiB: 413, declared or streamed in chunks.
    let big = format!(
        r#"{{"name":"Rex","categoryId":1,"pad":"{}"}}"#,
        "x".repeat(17 * 1024)
    );
    let r = c
        .post(b.url("/v1/pets"))
        .header("content-type", "application/json")
        .body(big.clone())
        .send()
        .await
        .unwrap();
    assert_error(r, 413, "payload_too_large").await;
    let chunks: Vec<Result<String, std::io::Error>> = big
        .as_bytes()
        .chunks(1024)
        .map(|c| Ok(String::from_utf8(c.to_vec()).unwrap()))
        .collect();
    let stream = reqwest::Body::wrap_stream(futures_stream(chunks));
    let r = c
        .post(b.url("/v1/pets"))
        .header("content-type", "application/json")
        .body(stream)
        .send()
        .await
        .unwrap();
    assert_error(r, 413, "payload_too_large").await;

    // A charset parameter is fine.
    let r = c
        .post(b.url("/v1/pets"))
        .header("content-type", "Application/JSON; charset=utf-8")
        .body(r#"{"name":"Second","categoryId":2}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);

    let (pets, _) = walk(&c, &b, "/v1/pets?limit=100").await;
    let names: Vec<&str> = pets.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["Only", "Second"],
        "refused requests created nothing"
    );
}

fn futures_stream(
    items: Vec<Result<String, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<String, std::io::Error>> {
    futures_util::stream::iter(items)
}

#[tokio::test]
async fn pagination_walks_every_pet_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let b = Backend::start(&dir.path().join("data"));
    let c = client();
    let statuses = ["available", "pending", "sold"];
    let mut created = Vec::new();
    for i in 0..53 {
        let status = statuses[i % 3];
        created.push(
            create(
                &c,
                &b,
                json!({"name": format!("pet {i}"), "categoryId": 1 + i, "status": status}),
            )
            .await,
        );
    }

    let (all, pages) = walk(&c, &b, "/v1/pets").await;
    assert_eq!(pages, 3, "default limit is 20");
    assert_eq!(all, created, "every pet once, in id order");

    let (all, pages) = walk(&c, &b, "/v1/pets?limit=7").await;
    assert_eq!((all.len(), pages), (53, 8));
    assert_eq!(all, created);

    for status in statuses {
        let want: Vec<Value> = created
            .iter()
            .filter(|p| p["status"] == status)
            .cloned()
            .collect();
        let (got, _) = walk(&c, &b, &format!("/v1/pets?status={status}&limit=4")).await;
        assert_eq!(got, want, "filter {status}");
        let ids: HashSet<i64> = got.iter().map(|p| p["id"].as_i64().unwrap()).collect();
        assert_eq!(ids.len(), got.len());
    }

    // The next link keeps limit and status.
    let r = c
        .get(b.url("/v1/pets?status=sold&limit=2"))
        .send()
        .await
        .unwrap();
    let link = r.headers()["link"].to_str().unwrap().to_owned();
    assert!(
        link.starts_with("</v1/pets?limit=2&status=sold&cursor="),
        "{link}"
    );

    // The last page has no link; limit=100 holds everything here.
    let r = c.get(b.url("/v1/pets?limit=100")).send().await.unwrap();
    assert!(r.headers().get("link").is_none());
    assert_eq!(r.json::<Vec<Value>>().await.unwrap().len(), 53);
}

#[tokio::test]
async fn list_parameters_are_validated() {
    let dir = tempfile::tempdir().unwrap();
    let b = Backend::start(&dir.path().join("data"));
    let c = client();
    let r = c.get(b.url("/v1/pets")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Vec<Value>>().await.unwrap(), Vec::<Value>::new());
    for query in [
        "limit=0",
        "limit=101",
        "limit=ten",
        "limit=-5",
        "status=lost",
        "cursor=abc",
        "limit=1&limit=2",
        "sort=name",
    ] {
        let r = c
            .get(b.url(&format!("/v1/pets?{query}")))
            .send()
            .await
            .unwrap();
        let err = assert_error(r, 400, "invalid_parameter").await;
        let param = query.split('=').next().unwrap();
        assert!(
            err["message"].as_str().unwrap().contains(param),
            "{err} names {param}"
        );
    }
    for query in [
        "limit=1",
        "limit=100",
        "status=available",
        "status=pending",
        "status=sold",
        // Past every id: an empty page, not an error.
        "cursor=9999999999999999999",
        "cursor=9975670773026005769&limit=1&status=sold",
    ] {
        let r = c
            .get(b.url(&format!("/v1/pets?{query}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{query}");
    }
}

#[tokio::test]
async fn get_by_id_statuses() {
    let dir = tempfile::tempdir().unwrap();
    let b = Backend::start(&dir.path().join("data"));
    let c = client();
    let pet = create(&c, &b, json!({"name": "Rex", "categoryId": 3})).await;
    let r = c
        .get(b.url(&format!("/v1/pets/{}", pet["id"])))
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap(), pet);
    let r = c.get(b.url("/v1/pets/999999")).send().await.unwrap();
    assert_error(r, 404, "not_found").await;
    for bad in ["abc", "1.5", "99999999999999999999", "-", "%20"] {
        let r = c
            .get(b.url(&format!("/v1/pets/{bad}")))
            .send()
            .await
            .unwrap();
        assert_error(r, 400, "invalid_parameter").await;
    }
}

#[tokio::test]
async fn unknown_paths_and_methods() {
    let dir = tempfile::tempdir().unwrap();
    let b = Backend::start(&dir.path().join("data"));
    let c = client();
    let pet = create(&c, &b, json!({"name": "Rex", "categoryId": 3})).await;
    assert_eq!(pet["id"], 1);
    for path in [
        "/",
        "/v1",
        "/v2/pets",
        "/v1/pets/1/extra",
        "/v1/store/orders",
        // One resource, one path: no second spelling with a trailing slash.
        "/v1/pets/",
        "/v1/pets/1/",
    ] {
        let r = c.get(b.url(path)).send().await.unwrap();
        assert_error(r, 404, "not_found").await;
    }
    for (method, path, allow) in [
        (reqwest::Method::DELETE, "/v1/pets", "GET, HEAD, POST"),
        (reqwest::Method::PUT, "/v1/pets", "GET, HEAD, POST"),
        (reqwest::Method::DELETE, "/v1/pets/1", "GET, HEAD"),
        (reqwest::Method::POST, "/v1/pets/1", "GET, HEAD"),
    ] {
        let r = c.request(method.clone(), b.url(path)).send().await.unwrap();
        assert_eq!(r.headers()["allow"], allow, "{method} {path}");
        assert_error(r, 405, "method_not_allowed").await;
    }
    let r = c
        .post(b.url("/v1/pets/"))
        .json(&json!({"name": "Max", "categoryId": 3}))
        .send()
        .await
        .unwrap();
    assert_error(r, 404, "not_found").await;
    let r = c.get(b.url("/v1/pets")).send().await.unwrap();
    let pets: Value = r.json().await.unwrap();
    assert_eq!(pets.as_array().unwrap().len(), 1, "nothing created: {pets}");
}

#[tokio::test]
async fn sigterm_exits_zero_and_keeps_data() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut b = Backend::start(&data);
    let c = client();
    let pet = create(&c, &b, json!({"name": "Rex", "categoryId": 3})).await;
    assert_eq!(b.proc.terminate(), Some(0), "log: {}", b.proc.log_text());
    drop(b);
    let b = Backend::start(&data);
    let r = c
        .get(b.url(&format!("/v1/pets/{}", pet["id"])))
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap(), pet);
    let next = create(&c, &b, json!({"name": "Tom", "categoryId": 3})).await;
    assert!(
        next["id"].as_i64() > pet["id"].as_i64(),
        "ids keep increasing across restarts"
    );
}
