//! Talking to the servers under test: an HTTP client, raw HTTP/1.1, the contract's error body,
//! links, metrics, and connections held open until the server closes them.

use super::*;

/// An HTTP client that never follows redirects and never reuses a stale pool across restarts.
/// Like any client of a server that closes idle connections (the gateway after 60 s), it gives
/// up its own idle connections sooner, so it never sends on one the gateway is closing.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .pool_idle_timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Asserts the contract's error body and returns it.
pub async fn assert_error(
    response: reqwest::Response,
    status: u16,
    code: &str,
) -> serde_json::Value {
    assert_eq!(
        response.status().as_u16(),
        status,
        "status for expected {code}"
    );
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(content_type.as_deref(), Some("application/json"));
    let body: serde_json::Value = response.json().await.expect("JSON error body");
    assert_eq!(body["code"], code, "body {body}");
    assert_eq!(body["status"], status, "body {body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "body {body}"
    );
    body
}

/// A key's public id: the part between `as_` and the secret.
pub fn key_id(key: &str) -> &str {
    &key[3..19]
}

/// Sends `request` verbatim over a fresh connection and reads the whole answer.
/// Returns (status, lower-cased headers, body).
pub fn raw_http(addr: SocketAddr, request: &[u8]) -> (u16, Vec<(String, String)>, String) {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream.write_all(request).unwrap();
    let mut buf = Vec::new();
    let _ = stream.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

/// The value of a header in a `raw_http` answer.
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// Every `Link` header of a response, in order.
pub fn links(r: &reqwest::Response) -> Vec<&str> {
    r.headers()
        .get_all("link")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect()
}

/// Every pet reachable from `first` by following `Link: <...>; rel="next"` on `base` (e.g.
/// `http://127.0.0.1:8080`), with the bearer `key` if given. Returns the pets in order and the
/// number of pages; asserts each page is a 200 and only the last may be empty.
pub async fn walk_pets(
    c: &reqwest::Client,
    base: &str,
    first: &str,
    key: Option<&str>,
) -> (Vec<serde_json::Value>, usize) {
    let mut pets = Vec::new();
    let mut next = Some(first.to_owned());
    let mut pages = 0;
    while let Some(path) = next {
        let mut request = c.get(format!("{base}{path}"));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let r = request.send().await.unwrap();
        assert_eq!(r.status(), 200, "page {path}");
        next = r.headers().get("link").map(|link| {
            let link = link.to_str().unwrap();
            assert!(link.ends_with(">; rel=\"next\""), "{link}");
            link[1..link.find('>').unwrap()].to_owned()
        });
        let page: Vec<serde_json::Value> = r.json().await.unwrap();
        assert!(
            !page.is_empty() || next.is_none(),
            "an empty page with a next link"
        );
        pets.extend(page);
        pages += 1;
    }
    (pets, pages)
}

/// The value of the metric line `name` (with its labels, if any) on an admin listener.
pub fn metric(admin: SocketAddr, name: &str) -> Option<f64> {
    let (_, _, body) = raw_http(
        admin,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Polls `metric` until `want` holds, for up to `within`; panics naming the metric otherwise.
pub fn wait_metric(admin: SocketAddr, name: &str, within: Duration, want: impl Fn(f64) -> bool) {
    let deadline = Instant::now() + within;
    loop {
        let value = metric(admin, name);
        if value.is_some_and(&want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} on {admin} is {value:?} after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits up to 10 s until `n` GETs to `route` count as `client_closed` with no response begun.
pub async fn wait_client_closed(admin: SocketAddr, route: &str, n: f64) {
    let series = format!(
        r#"gateway_responses_total{{method="GET",outcome="client_closed",route="{route}",status="none"}}"#
    );
    tokio::task::spawn_blocking(move || {
        wait_metric(admin, &series, Duration::from_secs(10), |v| v >= n);
    })
    .await
    .unwrap();
}

/// Writes `head` on `stream` one byte every 100 ms (each write is quick, the head as a whole is
/// not) and returns how long after the first byte the gateway closed the connection, or `None`
/// if the whole head went out without that. Panics if the gateway answers instead.
pub async fn trickle_until_closed<S>(stream: &mut S, head: &[u8]) -> Option<Duration>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let started = Instant::now();
    let mut buf = [0u8; 256];
    for byte in head {
        let sent = match stream.write_all(&[*byte]).await {
            Ok(()) => stream.flush().await,
            Err(e) => Err(e),
        };
        let read = tokio::time::timeout(Duration::from_millis(100), stream.read(&mut buf)).await;
        match (sent, read) {
            (Ok(()), Err(_)) => {} // nothing to read yet
            (_, Ok(Ok(n))) if n > 0 => {
                panic!("answered: {}", String::from_utf8_lossy(&buf[..n]))
            }
            _ => return Some(started.elapsed()),
        }
    }
    None
}

/// Checks what [`trickle_until_closed`] saw against a gateway whose `header_timeout_seconds` is
/// 1: closed after about a second, not before, and counted once.
pub fn assert_closed_at_header_timeout(closed_after: Option<Duration>, admin: SocketAddr) {
    let closed_after = closed_after.expect("the slow head was never closed");
    assert!(
        closed_after >= Duration::from_millis(900) && closed_after < Duration::from_secs(6),
        "closed after {closed_after:?}, the header timeout is 1 s"
    );
    assert_eq!(
        metric(admin, "gateway_client_timeouts_total{phase=\"header\"}"),
        Some(1.0)
    );
}
