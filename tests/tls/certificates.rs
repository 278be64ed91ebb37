//! Certificates: unusable ones refused at start and in `check-config`, one swapped by `SIGHUP`
//! under open connections, and an HTTPS upstream verified against its CA.

use super::*;

/// A certificate cut off, missing, of another key, expired, or a key given as the certificate
/// stops the start within seconds and fails `check-config`, from the file or from flags, each
/// naming the file and why; a TLS table with a listener and no files is a configuration error.
#[test]
fn unusable_certificates_are_clear_errors_at_start_and_in_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "good", false);
    let (other_cert, other_key) = ca.leaf(dir.path(), "other", false);
    let (expired_cert, expired_key) = ca.leaf(dir.path(), "expired", true);
    let _ = other_cert;
    let missing = dir.path().join("missing.crt");
    let cut = dir.path().join("cut.crt");
    let pem = std::fs::read(&cert).unwrap();
    let end = pem.windows(8).position(|w| w == b"-----END").unwrap();
    std::fs::write(&cut, &pem[..end]).unwrap();
    let cases: [(&Path, &Path, &str, &Path); 5] = [
        (
            &cut,
            &key,
            "it is cut off: no -----END CERTIFICATE----- line",
            &cut,
        ),
        (&missing, &key, "cannot read it", &missing),
        (
            &cert,
            &other_key,
            "does not belong to the certificate",
            &other_key,
        ),
        (&expired_cert, &expired_key, "expired on", &expired_cert),
        (&key, &key, "no certificate in it", &key),
    ];
    for (cert, key, why, file) in cases {
        let tls = free_addr().to_string();
        let started = Instant::now();
        let (code, stderr) = start_with_tls(dir.path(), &shipped_config(), &tls, cert, key);
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(code, 1, "{why}: {stderr}");
        assert!(
            stderr.contains(why) && stderr.contains(file.to_str().unwrap()),
            "{why}: {stderr}"
        );
        let config = dir.path().join("tls.toml");
        std::fs::write(&config, tls_table(&tls, cert, key)).unwrap();
        let (code, _, stderr) = cli(&["check-config", config.to_str().unwrap()]);
        assert_eq!(code, 1, "check-config, {why}: {stderr}");
        assert!(
            stderr.contains(why) && stderr.contains(file.to_str().unwrap()),
            "{stderr}"
        );
        // Given as flags, as a start takes them, they are checked alike.
        let (code, _, stderr) = check_with_flags(&tls, cert, key);
        assert_eq!(code, 1, "check-config with flags, {why}: {stderr}");
        assert!(
            stderr.contains(why) && stderr.contains(file.to_str().unwrap()),
            "{stderr}"
        );
    }
    let tls = free_addr().to_string();
    let (code, stdout, stderr) = check_with_flags(&tls, &cert, &key);
    assert_eq!(code, 0, "a good pair as flags: {stderr}");
    assert!(stdout.ends_with(": ok\n"), "{stdout}");
    let half = dir.path().join("half.toml");
    std::fs::write(&half, "[gateway.tls]\nlisten = \"127.0.0.1:1\"\n").unwrap();
    let (code, _, stderr) = cli(&["check-config", half.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(stderr.contains("gateway.tls"), "{stderr}");
}

/// A private key every user of the machine may read still starts and passes `check-config`, with
/// a warning naming the file, its mode and the `chmod` that closes it: in `check-config`, in the
/// start's log and at a `SIGHUP`; a key kept to its owner and group (0640) gets none.
#[test]
fn a_private_key_every_user_may_read_is_named_in_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = TestCa::new().leaf(dir.path(), "server", false);
    let warning = format!(
        "{key} holds the TLS private key, and every user of this machine may read it (mode 0644): \
         `chmod o-rwx {key}` keeps it to its owner and group",
        key = key.display()
    );
    let tls = free_addr().to_string();
    set_mode(&key, 0o644);
    let (code, stdout, stderr) = check_with_flags(&tls, &cert, &key);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.ends_with(": ok\n"), "{stdout}");
    assert!(stderr.contains(&format!("warning: {warning}")), "{stderr}");
    set_mode(&key, 0o640);
    let (code, _, stderr) = check_with_flags(&tls, &cert, &key);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("holds the TLS private key"), "{stderr}");

    set_mode(&key, 0o644);
    let (stack, _) = tls_stack(dir.path(), &cert, &key);
    stack.proc.wait_log(&format!("gateway: TLS: {warning}"));
    set_mode(&key, 0o640);
    kill(stack.proc.pid(), Signal::SIGHUP).unwrap();
    // A warning would come before the reload's line.
    let log = stack.proc.wait_log("configuration reloaded");
    assert!(!log.contains("SIGHUP: TLS:"), "{log}");
    set_mode(&key, 0o600 | 0o006);
    kill(stack.proc.pid(), Signal::SIGHUP).unwrap();
    stack.proc.wait_log(&format!(
        "gateway: SIGHUP: TLS: {} holds the TLS private key, and every user of this machine may \
         read and replace it (mode 0606)",
        key.display()
    ));
}

/// `check-config` of the shipped configuration with a TLS listener, `cert` and `key` as flags:
/// (exit code, stdout, stderr).
fn check_with_flags(tls: &str, cert: &Path, key: &Path) -> (i32, String, String) {
    let shipped = shipped_config();
    cli(&[
        "check-config",
        shipped.to_str().unwrap(),
        "--tls-listen",
        tls,
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ])
}

/// The status of a GET of `url` with `api_key`, by `client`.
async fn get_status(client: &reqwest::Client, url: &str, api_key: &str) -> u16 {
    let r = client.get(url).bearer_auth(api_key).send().await.unwrap();
    r.status().as_u16()
}

/// `SIGHUP` gives new handshakes the new certificate while a connection made before goes on
/// being served; a damaged file on `SIGHUP` changes nothing and is counted as a refused reload.
#[tokio::test]
async fn sighup_swaps_the_certificate_without_dropping_connections() {
    let dir = tempfile::tempdir().unwrap();
    let (old_ca, new_ca) = (TestCa::new(), TestCa::new());
    let (cert, key) = old_ca.leaf(dir.path(), "server", false);
    let (stack, tls) = tls_stack(dir.path(), &cert, &key);
    let url = format!("https://localhost:{}/v1/pets", tls.port());
    let api_key = stack.key(&["--plan", "pro"]);
    let old = old_ca.client(false);
    assert_eq!(get_status(&old, &url, &api_key).await, 200);
    assert!(
        new_ca.client(false).get(&url).send().await.is_err(),
        "not trusted yet"
    );

    // New files in place, then SIGHUP.
    let (new_cert, new_key) = new_ca.leaf(dir.path(), "next", false);
    std::fs::copy(&new_cert, &cert).unwrap();
    std::fs::copy(&new_key, &key).unwrap();
    kill(stack.proc.pid(), Signal::SIGHUP).unwrap();
    stack.proc.wait_log("configuration reloaded");
    let fresh = new_ca.client(false);
    assert_eq!(get_status(&fresh, &url, &api_key).await, 200);
    // The connection made before the reload is still open and still served: a new one would
    // be refused, since this client trusts only the old CA.
    assert_eq!(get_status(&old, &url, &api_key).await, 200);

    // A damaged file on SIGHUP changes nothing and is counted.
    std::fs::write(&cert, "not a certificate").unwrap();
    kill(stack.proc.pid(), Signal::SIGHUP).unwrap();
    stack.proc.wait_log("the configuration was refused");
    assert_eq!(
        metric(stack.admin, "gateway_reloads_total{result=\"error\"}"),
        Some(1.0)
    );
    assert_eq!(get_status(&new_ca.client(false), &url, &api_key).await, 200);
}

/// A route with `tls = true` reaches its upstream over HTTPS, verified against the configured
/// CA, with the post-quantum key exchange when the upstream has it and without a second
/// ClientHello when it has not; an upstream whose
/// certificate the CA did not sign gets 502, never a silent pass.
#[tokio::test]
async fn a_route_with_tls_speaks_https_to_its_upstream_and_verifies_it() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, stranger) = (TestCa::new(), TestCa::new());
    let trusted = common::TestUpstream::start_tls(ca.acceptor(dir.path())).await;
    // An upstream on rustls with ring, which has no post-quantum group and, as every rustls
    // server, takes the first group of the client's list it has.
    #[allow(deprecated)]
    let ring = std::sync::Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let classic = common::TestUpstream::start_tls(ca.acceptor_on(dir.path(), ring)).await;
    let unknown = common::TestUpstream::start_tls(stranger.acceptor(dir.path())).await;
    let ca_file = ca.write_pem(dir.path());
    let route = |prefix: &str, addr: SocketAddr| {
        format!(
            "[[gateway.routes]]\nprefix = \"{prefix}\"\nupstream = \"{addr}\"\ntls = true\nsni = \"localhost\"\nca = \"{}\"\n",
            ca_file.display()
        )
    };
    let stack = Stack::start_with_text(
        dir.path(),
        &format!(
            "{}{}{}{}",
            common::PETS_ROUTE,
            route("/v1/secure", trusted.addr),
            route("/v1/classic", classic.addr),
            route("/v1/impostor", unknown.addr)
        ),
    );
    let key = stack.key(&["--plan", "pro"]);
    let c = client();
    let r = stack.get(&c, "/v1/secure/orders", &key).await;
    assert_eq!(r.status(), 200);
    let echo: serde_json::Value = r.json().await.unwrap();
    assert_eq!(echo["path"], "/v1/secure/orders");
    assert_eq!(trusted.hits(), 1);
    // The gateway's connector offers the post-quantum group first too, and this upstream has it;
    // one without it finds X25519 next, whose key share came with the first ClientHello.
    assert_eq!(
        trusted.key_exchange_groups(),
        ["Some(X25519MLKEM768) Some(Full)"]
    );
    let r = stack.get(&c, "/v1/classic/orders", &key).await;
    assert_eq!(r.status(), 200);
    assert_eq!(classic.key_exchange_groups(), ["Some(X25519) Some(Full)"]);
    assert_error(
        stack.get(&c, "/v1/impostor/x", &key).await,
        502,
        "bad_gateway",
    )
    .await;
    assert_eq!(
        unknown.hits(),
        0,
        "nothing was sent to an unverified upstream"
    );
}
