//! Idempotent creates (`Idempotency-Key`, IETF httpapi draft) through the gateway and backend.

mod common;

use common::{Stack, assert_error, client};
use serde_json::{Value, json};

async fn create(
    c: &reqwest::Client,
    stack: &Stack,
    key: &str,
    idem: &str,
    body: &Value,
) -> reqwest::Response {
    c.post(stack.url("/v1/pets"))
        .bearer_auth(key)
        .header("Idempotency-Key", idem)
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn all_pets(c: &reqwest::Client, stack: &Stack, key: &str) -> Vec<Value> {
    let r = stack.get(c, "/v1/pets?limit=100", key).await;
    r.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_with_the_same_key_return_the_original_pet() {
    let dir = tempfile::tempdir().unwrap();
    let mut stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "pro"]);
    let c = client();
    let body = json!({"name": "Rex", "categoryId": 3});
    let first = create(&c, &stack, &key, "order-1", &body).await;
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let location = first.headers()["location"].clone();
    let pet: Value = first.json().await.unwrap();

    // A retry, even with the fields in another order or quoted as a structured-field string.
    let retry = create(
        &c,
        &stack,
        &key,
        "\"order-1\"",
        &json!({"categoryId": 3, "name": "Rex"}),
    )
    .await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.headers()["location"], location);
    assert_eq!(retry.json::<Value>().await.unwrap(), pet);

    // The same key with another body: 422, nothing created.
    let other = create(
        &c,
        &stack,
        &key,
        "order-1",
        &json!({"name": "Tom", "categoryId": 3}),
    )
    .await;
    assert_error(other, 422, "idempotency_key_reused").await;
    assert_eq!(all_pets(&c, &stack, &key).await, vec![pet.clone()]);

    // Malformed keys are refused.
    let long = "k".repeat(256);
    assert_error(
        create(&c, &stack, &key, &long, &body).await,
        400,
        "invalid_parameter",
    )
    .await;

    // Another API key's idempotency keys are its own.
    let other_key = stack.key(&["--plan", "pro"]);
    let theirs = create(&c, &stack, &other_key, "order-1", &body).await;
    assert_eq!(theirs.status(), 201);
    assert_ne!(theirs.json::<Value>().await.unwrap()["id"], pet["id"]);

    // Remembered durably: after a restart the retry still finds the original.
    assert_eq!(stack.proc.terminate(), Some(0));
    drop(stack);
    let stack = Stack::launch(
        dir.path(),
        dir.path().join("data"),
        &common::shipped_config(),
    );
    stack.wait_keys_loaded();
    let retry = create(&c, &stack, &key, "order-1", &body).await;
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.json::<Value>().await.unwrap(), pet);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_create_one_pet() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "pro"]);
    let c = client();
    let body = json!({"name": "Twin", "categoryId": 1, "status": "pending"});
    let attempts: Vec<_> = (0..24)
        .map(|_| {
            let (c, url, key, body) = (c.clone(), stack.url("/v1/pets"), key.clone(), body.clone());
            tokio::spawn(async move {
                let r = c
                    .post(url)
                    .bearer_auth(key)
                    .header("Idempotency-Key", "same")
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 201);
                r.json::<Value>().await.unwrap()["id"].as_i64().unwrap()
            })
        })
        .collect();
    let mut ids = Vec::new();
    for attempt in attempts {
        ids.push(attempt.await.unwrap());
    }
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 1, "every duplicate got the same pet: {ids:?}");
    assert_eq!(all_pets(&c, &stack, &key).await.len(), 1);
}
