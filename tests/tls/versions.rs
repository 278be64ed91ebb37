//! The TLS versions the gateway's HTTPS listener speaks, through the real binary: TLS 1.2 and 1.3
//! by default, TLS 1.3 alone with `[gateway.tls] min_version = "1.3"`, which a `SIGHUP` does not
//! change (the listener's versions are fixed while it runs), and a version it does not know is a
//! configuration error naming the setting.

use std::path::Path;
use std::time::Duration;

use super::common::tls::{TestCa, connect_with, exchange, list_and_close};
use super::common::{Stack, cli, shipped_config, wait_metric};
use super::handshakes;
use nix::sys::signal::{Signal, kill};
use tokio_rustls::rustls::version::{TLS12, TLS13};
use tokio_rustls::rustls::{AlertDescription, Error as TlsError, ProtocolVersion};

/// Writes the shipped configuration with `line` in place of its `min_version` to `path`.
fn write_config(path: &Path, line: &str) {
    let shipped = std::fs::read_to_string(shipped_config()).unwrap();
    let ours = "\nmin_version = \"1.2\"\n";
    assert!(shipped.contains(ours));
    let text = shipped.replacen(ours, &format!("\n{line}\n"), 1);
    std::fs::write(path, text).unwrap();
}

/// With `min_version = "1.3"`, a client that speaks TLS 1.3 is served, and one that speaks only
/// TLS 1.2 is refused in the handshake with a `protocol_version` alert, before any request: no
/// TLS 1.2 handshake is counted. A `SIGHUP` with the setting back at "1.2" reloads the rest of
/// the file, warns that the versions change only at a restart, and TLS 1.2 stays refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_min_version_1_3_a_tls_1_2_client_is_refused_with_a_protocol_version_alert() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let config = dir.path().join("tls13.toml");
    write_config(&config, "min_version = \"1.3\"");
    let (stack, tls) = Stack::start_tls(dir.path(), &config, &cert, &key);
    let get = list_and_close(&stack.key(&["--plan", "pro"]));
    let refused = |version| {
        let client = ca.client_config(b"http/1.1", &[version]);
        async move {
            let error = connect_with(&client, tls).await.unwrap_err();
            let inner = error.get_ref().and_then(|e| e.downcast_ref::<TlsError>());
            assert!(
                matches!(
                    inner,
                    Some(TlsError::AlertReceived(AlertDescription::ProtocolVersion))
                ),
                "{error:?}"
            );
        }
    };
    let served = || async {
        let client = ca.client_config(b"http/1.1", &[&TLS13]);
        let mut s = connect_with(&client, tls).await.unwrap();
        assert_eq!(
            s.get_ref().1.protocol_version(),
            Some(ProtocolVersion::TLSv1_3)
        );
        let answer = exchange(&mut s, get.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    };

    served().await;
    refused(&TLS12).await;
    assert_eq!(handshakes(&stack, "TLSv1.3"), [1.0, 0.0]);
    assert_eq!(handshakes(&stack, "TLSv1.2"), [0.0, 0.0]);

    write_config(&config, "min_version = \"1.2\"");
    kill(stack.proc.pid(), Signal::SIGHUP).unwrap();
    let series = "gateway_reloads_total{result=\"ok\"}";
    wait_metric(stack.admin, series, Duration::from_secs(10), |v| v >= 1.0);
    stack
        .proc
        .wait_log("tls.min_version take effect only at a restart");
    refused(&TLS12).await;
    served().await;
    assert_eq!(handshakes(&stack, "TLSv1.2"), [0.0, 0.0]);
}

/// The default serves TLS 1.2 and 1.3 alike, and says so if asked in the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_and_with_min_version_1_2_both_versions_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let config = dir.path().join("tls12.toml");
    write_config(&config, "min_version = \"1.2\"");
    for file in [shipped_config(), config] {
        let run = tempfile::tempdir().unwrap();
        let (stack, tls) = Stack::start_tls(run.path(), &file, &cert, &key);
        let get = list_and_close(&stack.key(&["--plan", "pro"]));
        for (version, name) in [
            (&TLS12, ProtocolVersion::TLSv1_2),
            (&TLS13, ProtocolVersion::TLSv1_3),
        ] {
            let client = ca.client_config(b"http/1.1", &[version]);
            let mut s = connect_with(&client, tls).await.unwrap();
            assert_eq!(s.get_ref().1.protocol_version(), Some(name), "{file:?}");
            let answer = exchange(&mut s, get.as_bytes()).await;
            assert!(answer.starts_with("HTTP/1.1 200 "), "{file:?}: {answer}");
        }
    }
}

/// A version the gateway does not speak, or not written as a version, fails `check-config` with
/// the line at fault and what to write; the number `1.3` (a float to TOML) is told to be quoted.
#[test]
fn a_min_version_that_is_not_1_2_or_1_3_is_a_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    let expected = r#"expected "1.2" or "1.3""#;
    for (value, why) in [
        ("\"1.1\"", expected),
        ("\"TLSv1.3\"", expected),
        ("12", expected),
        (
            "1.3",
            r#"a TLS version is written in quotes: min_version = "1.3""#,
        ),
    ] {
        write_config(&config, &format!("min_version = {value}"));
        let (code, _, stderr) = cli(&["check-config", config.to_str().unwrap()]);
        assert_eq!(code, 1, "{value}: {stderr}");
        assert!(
            stderr.contains(why) && stderr.contains("line "),
            "{value}: {stderr}"
        );
    }
    write_config(&config, "min_version = \"1.3\"");
    let (code, _, stderr) = cli(&["check-config", config.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
}
