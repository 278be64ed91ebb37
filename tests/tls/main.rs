//! TLS and HTTP/2 at the edge, through the real binary, with certificates the tests make: one
//! test binary, a module per concern (what HTTPS speaks, certificates, connections, session
//! tickets, protocol versions).

#[path = "../common/mod.rs"]
mod common;

mod certificates;
mod connections;
mod protocols;
mod tickets;
mod versions;

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

/// Starts `animal-store gateway` with `config` and a TLS listener on `tls` with `cert` and `key`
/// given on the command line, data in `dir`, and waits for it to end; its exit code and stderr.
/// For starts that must fail.
fn start_with_tls(dir: &Path, config: &Path, tls: &str, cert: &Path, key: &Path) -> (i32, String) {
    let (code, _, stderr) = cli(&[
        "gateway",
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        dir.join("data").to_str().unwrap(),
        "--listen",
        &free_addr().to_string(),
        "--admin-listen",
        &free_addr().to_string(),
        "--tls-listen",
        tls,
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]);
    (code, stderr)
}

/// Sets `path`'s mode bits to `mode`.
fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A configuration file's `[gateway.tls]` table with the listener on `tls`, `cert` and `key`.
fn tls_table(tls: &str, cert: &Path, key: &Path) -> String {
    format!(
        "[gateway.tls]\nlisten = \"{tls}\"\ncert = \"{}\"\nkey = \"{}\"\n",
        cert.display(),
        key.display()
    )
}

/// The handshakes a gateway counted, full and resumed, of one version (`TLSv1.3`, `TLSv1.2`).
fn handshakes(stack: &Stack, version: &str) -> [f64; 2] {
    ["full", "resumed"].map(|session| {
        let series =
            format!("gateway_tls_handshakes_total{{session=\"{session}\",version=\"{version}\"}}");
        metric(stack.admin, &series).unwrap_or(0.0)
    })
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
