//! Plans, exact limits, headers and bans, through the real binary (`animal-store serve`).

mod common;

use std::time::Duration;

use common::{PETS_ROUTE, Stack, assert_error, client, unix_now};
use nix::sys::signal::Signal;
use reqwest::header::HeaderMap;

fn h<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("missing {name}"))
        .to_str()
        .unwrap()
}

fn num(headers: &HeaderMap, name: &str) -> u64 {
    h(headers, name).parse().unwrap()
}

#[tokio::test]
async fn free_key_counts_down_exactly_then_refuses_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "free"]);
    let c = client();
    let mut reset = None;
    let mut request_ids = std::collections::HashSet::new();
    for expected in (0..60).rev() {
        let r = stack.get(&c, "/v1/pets", &key).await;
        assert_eq!(r.status(), 200);
        let hd = r.headers();
        assert_eq!(num(hd, "x-ratelimit-limit"), 60);
        assert_eq!(num(hd, "x-ratelimit-remaining"), expected);
        assert_eq!(
            h(hd, "ratelimit-policy"),
            r#""minute";q=60;w=60, "day";q=1000;w=86400"#
        );
        assert!(h(hd, "ratelimit").starts_with(&format!("\"minute\";r={expected};t=")));
        let this_reset = num(hd, "x-ratelimit-reset");
        assert_eq!(
            *reset.get_or_insert(this_reset),
            this_reset,
            "one window, one reset"
        );
        assert!(
            request_ids.insert(h(hd, "x-request-id").to_owned()),
            "request ids are unique"
        );
    }
    let now = unix_now();
    assert!((now..=now + 61).contains(&reset.unwrap()));
    let r = stack.get(&c, "/v1/pets", &key).await;
    let hd = r.headers().clone();
    let retry: u64 = num(&hd, "retry-after");
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    assert_eq!(num(&hd, "x-ratelimit-remaining"), 0);
    assert_eq!(num(&hd, "x-ratelimit-reset"), reset.unwrap());
    assert!(h(&hd, "ratelimit").starts_with("\"minute\";r=0;t="));
    let body = assert_error(r, 429, "rate_limited").await;
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("60 requests per minute")
    );
}

#[tokio::test]
async fn of_150_concurrent_requests_exactly_60_are_admitted() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.key(&["--plan", "free"]);
    let c = client();
    let requests = (0..150).map(|_| {
        let (c, url, key) = (c.clone(), stack.url("/v1/pets"), key.clone());
        tokio::spawn(async move {
            let r = c.get(url).bearer_auth(key).send().await.unwrap();
            let status = r.status().as_u16();
            let retry = r
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
            let code = if status == 429 {
                r.json::<serde_json::Value>().await.unwrap()["code"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            } else {
                String::new()
            };
            (status, retry, code)
        })
    });
    let mut admitted = 0;
    let mut refused = 0;
    for request in requests.collect::<Vec<_>>() {
        let (status, retry, code) = request.await.unwrap();
        match status {
            200 => admitted += 1,
            429 => {
                refused += 1;
                assert!(retry.is_some(), "429 without Retry-After");
                assert!(code == "rate_limited" || code == "key_banned", "{code}");
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!((admitted, refused), (60, 90));
    // 90 refusals in one window: the key is now banned, for the configured 15 minutes.
    let r = stack.get(&c, "/v1/pets", &key).await;
    let retry = num(r.headers(), "retry-after");
    assert!((890..=900).contains(&retry), "ban Retry-After {retry}");
    assert_eq!(num(r.headers(), "x-ratelimit-remaining"), 0);
    let reset = num(r.headers(), "x-ratelimit-reset");
    assert!((unix_now() + 890..=unix_now() + 901).contains(&reset));
    assert_error(r, 429, "key_banned").await;
}

#[tokio::test]
async fn a_retry_after_retry_after_seconds_is_admitted() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.enterprise_key(2, 100);
    let c = client();
    for _ in 0..2 {
        assert_eq!(stack.get(&c, "/v1/pets", &key).await.status(), 200);
    }
    let r = stack.get(&c, "/v1/pets", &key).await;
    assert_eq!(r.status(), 429);
    let retry = num(r.headers(), "retry-after");
    tokio::time::sleep(Duration::from_secs(retry)).await;
    let r = stack.get(&c, "/v1/pets", &key).await;
    assert_eq!(r.status(), 200, "admitted after Retry-After ({retry} s)");
    assert_eq!(
        num(r.headers(), "x-ratelimit-remaining"),
        1,
        "a fresh window"
    );
}

#[tokio::test]
async fn the_day_quota_answers_quota_exceeded_until_utc_midnight() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start(dir.path());
    let key = stack.enterprise_key(100, 3);
    let c = client();
    let midnight = (unix_now() / 86_400 + 1) * 86_400;
    for remaining in [2, 1, 0] {
        let r = stack.get(&c, "/v1/pets", &key).await;
        assert_eq!(r.status(), 200);
        assert_eq!(num(r.headers(), "x-ratelimit-remaining"), remaining);
        assert_eq!(
            num(r.headers(), "x-ratelimit-limit"),
            3,
            "the day window has fewest remaining"
        );
        assert_eq!(num(r.headers(), "x-ratelimit-reset"), midnight);
    }
    let r = stack.get(&c, "/v1/pets", &key).await;
    let retry = num(r.headers(), "retry-after");
    let expected = midnight - unix_now();
    assert!(
        retry.abs_diff(expected) <= 2,
        "Retry-After {retry} vs {expected} s to midnight"
    );
    assert!(h(r.headers(), "ratelimit").starts_with("\"day\";r=0;t="));
    assert_error(r, 429, "quota_exceeded").await;
}

#[tokio::test]
async fn bans_last_their_configured_time_double_and_spare_other_keys() {
    let dir = tempfile::tempdir().unwrap();
    let config =
        format!("[gateway.bans]\nthreshold = 3\nbase_seconds = 2\nmax_seconds = 3\n{PETS_ROUTE}");
    let stack = Stack::start_with_text(dir.path(), &config);
    let key = stack.enterprise_key(1, 1000);
    let other = stack.enterprise_key(1, 1000);
    let c = client();
    let get = |k: &str| {
        c.get(stack.url("/v1/pets"))
            .bearer_auth(k.to_owned())
            .send()
    };
    assert_eq!(get(&key).await.unwrap().status(), 200);
    for _ in 0..3 {
        assert_error(get(&key).await.unwrap(), 429, "rate_limited").await;
    }
    // The fourth refusal in the window is one more than the threshold: banned for 2 s.
    let r = get(&key).await.unwrap();
    assert_eq!(num(r.headers(), "retry-after"), 2);
    assert_error(r, 429, "key_banned").await;
    assert_error(get(&key).await.unwrap(), 429, "key_banned").await;
    assert_eq!(
        get(&other).await.unwrap().status(),
        200,
        "other keys are unaffected"
    );

    tokio::time::sleep(Duration::from_secs(2)).await;
    // The ban is over; the minute window is still spent.
    assert_error(get(&key).await.unwrap(), 429, "rate_limited").await;
    for _ in 0..2 {
        assert_error(get(&key).await.unwrap(), 429, "rate_limited").await;
    }
    // A second ban within the repeat window doubles, capped at max_seconds = 3.
    let r = get(&key).await.unwrap();
    assert_eq!(num(r.headers(), "retry-after"), 3);
    assert_error(r, 429, "key_banned").await;
}

/// The embedded store: a gateway stopped with SIGINT or SIGTERM and started again over the same
/// data directory forgets no count, quota or ban.
#[tokio::test]
async fn counts_quotas_and_bans_survive_a_graceful_restart() {
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        let dir = tempfile::tempdir().unwrap();
        let mut stack = Stack::start(dir.path());
        let minute = stack.enterprise_key(5, 1000);
        let day = stack.enterprise_key(100, 4);
        let banned = stack.enterprise_key(1, 1000);
        let c = client();
        for _ in 0..3 {
            assert_eq!(stack.get(&c, "/v1/pets", &minute).await.status(), 200);
        }
        for _ in 0..4 {
            assert_eq!(stack.get(&c, "/v1/pets", &day).await.status(), 200);
        }
        assert_eq!(stack.get(&c, "/v1/pets", &banned).await.status(), 200);
        for _ in 0..10 {
            assert_eq!(stack.get(&c, "/v1/pets", &banned).await.status(), 429);
        }
        assert_error(stack.get(&c, "/v1/pets", &banned).await, 429, "key_banned").await;

        assert_eq!(stack.proc.stop_with(signal), Some(0), "{signal}");
        let stack = Stack::launch(dir.path(), stack.data_dir.clone(), &stack.config);
        let r = stack.get(&c, "/v1/pets", &minute).await;
        assert_eq!(
            num(r.headers(), "x-ratelimit-remaining"),
            1,
            "after {signal}"
        );
        let r = stack.get(&c, "/v1/pets", &day).await;
        assert_error(r, 429, "quota_exceeded").await;
        let r = stack.get(&c, "/v1/pets", &banned).await;
        assert!(
            num(r.headers(), "retry-after") > 800,
            "the ban goes on after {signal}"
        );
        assert_error(r, 429, "key_banned").await;
    }
}

/// The embedded store after SIGKILL: counts older than a second are there; at most the last
/// second's are lost.
#[tokio::test]
async fn a_sigkill_loses_at_most_the_last_second_of_counts() {
    let dir = tempfile::tempdir().unwrap();
    let mut stack = Stack::start(dir.path());
    let key = stack.enterprise_key(1000, 100_000);
    let c = client();
    for _ in 0..5 {
        assert_eq!(stack.get(&c, "/v1/pets", &key).await.status(), 200);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for _ in 0..3 {
        assert_eq!(stack.get(&c, "/v1/pets", &key).await.status(), 200);
    }
    stack.proc.kill9();
    let mut stack = Stack::launch(dir.path(), stack.data_dir.clone(), &stack.config);
    let r = stack.get(&c, "/v1/pets", &key).await;
    let remaining = num(r.headers(), "x-ratelimit-remaining");
    // 8 were admitted before the kill; the 5 older than a second must have survived.
    assert!(
        (1000 - 9..=1000 - 6).contains(&remaining),
        "remaining {remaining}: counts older than a second were lost"
    );

    // Again, over what the first restart restored: its first write is a new snapshot
    // (`limits.bin`), the next ones append what changed to `limits.journal`.
    for _ in 0..2 {
        for _ in 0..5 {
            assert_eq!(stack.get(&c, "/v1/pets", &key).await.status(), 200);
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let journal = std::fs::metadata(stack.data_dir.join("limits.journal")).unwrap();
    assert!(journal.len() > 16, "a batch was appended to the journal");
    stack.proc.kill9();
    let stack = Stack::launch(dir.path(), stack.data_dir.clone(), &stack.config);
    let r = stack.get(&c, "/v1/pets", &key).await;
    let after = num(r.headers(), "x-ratelimit-remaining");
    assert_eq!(
        after,
        remaining - 11,
        "the 11 requests of the second process, all older than a second, survived"
    );
}
