//! TLS session resumption with tickets, through the real binary: a returning client resumes at
//! the gateway that served it, and, with `[gateway.tls] ticket_keys`, at any gateway sharing the
//! key files, through a rotation made with `SIGHUP`; with tickets off, only from the gateway's
//! cache of sessions.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::common::tls::{TestCa, connect_with, exchange, list_and_close};
use super::common::{Stack, cli, free_addr, shipped_config, wait_metric};
use super::{handshakes, set_mode, start_with_tls, tls_table};
use nix::sys::signal::{Signal, kill};
use tokio_rustls::rustls::HandshakeKind::{self, Full, Resumed};
use tokio_rustls::rustls::version::{TLS12, TLS13};
use tokio_rustls::rustls::{ClientConfig, SupportedProtocolVersion};

/// A key file of 80 random bytes, as `openssl rand 80` writes, its owner's alone (as the README's
/// `install -m 600` makes it).
fn ticket_key(dir: &Path, name: &str) -> PathBuf {
    let mut bytes = [0u8; 80];
    getrandom::fill(&mut bytes).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    set_mode(&path, 0o600);
    path
}

/// Writes the shipped configuration with `ticket_keys` to `path` (again, for a reload).
fn write_config(path: &Path, ticket_keys: &[&Path]) {
    let list: Vec<String> = ticket_keys
        .iter()
        .map(|k| format!("{:?}", k.display().to_string()))
        .collect();
    write_tls_config(path, &format!("ticket_keys = [{}]", list.join(", ")));
}

/// Writes the shipped configuration with `lines` in place of its `ticket_keys` and
/// `session_tickets` to `path`.
fn write_tls_config(path: &Path, lines: &str) {
    let shipped = std::fs::read_to_string(shipped_config()).unwrap();
    let ours = "\nticket_keys = []\n";
    let theirs = "\nsession_tickets = true\n";
    assert!(shipped.contains(ours) && shipped.contains(theirs));
    let text = shipped
        .replacen(theirs, "\n", 1)
        .replacen(ours, &format!("\n{lines}\n"), 1);
    std::fs::write(path, text).unwrap();
}

/// A GET through `addr` with a client of `config` (its session cache kept between calls); how
/// the handshake went. Read to the end: a TLS 1.3 ticket comes after the handshake.
async fn visit(
    config: &std::sync::Arc<ClientConfig>,
    addr: SocketAddr,
    request: &str,
) -> HandshakeKind {
    let mut s = connect_with(config, addr).await.unwrap();
    let kind = s.get_ref().1.handshake_kind().unwrap();
    let answer = exchange(&mut s, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    kind
}

/// 300 new clients of `version`, one connection each, more than rustls's cache of sessions holds
/// (256): each a full handshake, answered by the gateway itself (no key, nothing counted).
async fn three_hundred_others(
    ca: &TestCa,
    addr: SocketAddr,
    version: &'static SupportedProtocolVersion,
) {
    let keyless = "GET /v1/docs/ HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    for _ in 0..300 {
        let mut s = connect_with(&ca.client_config(b"http/1.1", &[version]), addr)
            .await
            .unwrap();
        assert_eq!(s.get_ref().1.handshake_kind(), Some(Full));
        let answer = exchange(&mut s, keyless.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 308 "), "{answer}");
    }
}

/// A returning client resumes its session with the ticket the gateway gave it, over TLS 1.3 and
/// 1.2, even after more new clients came in between than rustls's session cache holds (256, the
/// only resumption without tickets: each of the 300 here leaves two TLS 1.3 sessions or one 1.2
/// session in it); each resumed connection is served. Without `ticket_keys`, a ticket from
/// another gateway (of a fleet, or from before a restart) gets a full handshake, and is served
/// too. `/metrics` counts each kind of handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returning_clients_resume_with_tickets_after_many_others_and_foreign_tickets_get_a_full_handshake()
 {
    let (dir, other_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let (stack, tls) = Stack::start_tls(dir.path(), &shipped_config(), &cert, &key);
    let (other, other_tls) = Stack::start_tls(other_dir.path(), &shipped_config(), &cert, &key);
    let get = |stack: &Stack| list_and_close(&stack.key(&["--plan", "pro"]));
    let (get, other_get) = (get(&stack), get(&other));
    for version in [&TLS13, &TLS12] {
        let returning = ca.client_config(b"http/1.1", &[version]);
        let mut kinds = vec![visit(&returning, tls, &get).await];
        kinds.push(visit(&returning, tls, &get).await);
        three_hundred_others(&ca, tls, version).await;
        kinds.push(visit(&returning, tls, &get).await);
        kinds.push(visit(&returning, other_tls, &other_get).await);
        assert_eq!(
            kinds,
            [Full, Resumed, Resumed, Full],
            "{version:?}: first visit, return, return after 300 others, another gateway"
        );
    }
    for version in ["TLSv1.3", "TLSv1.2"] {
        assert_eq!(
            handshakes(&stack, version),
            [301.0, 2.0],
            "{version}: the first visit and the 300 others full, two returns resumed"
        );
        assert_eq!(
            handshakes(&other, version),
            [1.0, 0.0],
            "{version}: the other gateway's one full handshake"
        );
    }
}

/// Gateways given the same `ticket_keys` resume each other's sessions, over TLS 1.3 and 1.2, as a
/// fleet behind a load balancer needs. A rotation by `SIGHUP` loses no one: with a new key added
/// second, then moved first, tickets under either key resume at both gateways; once the old key
/// is dropped its tickets get a full handshake, and a key file with an error on `SIGHUP` changes
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_sharing_ticket_keys_resume_each_others_sessions_through_a_rotation() {
    let (dir, a_dir, b_dir) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let (old, new) = (
        ticket_key(dir.path(), "old.key"),
        ticket_key(dir.path(), "new.key"),
    );
    let (a_config, b_config) = (a_dir.path().join("a.toml"), b_dir.path().join("b.toml"));
    write_config(&a_config, &[&old]);
    write_config(&b_config, &[&old]);
    let (a, a_tls) = Stack::start_tls(a_dir.path(), &a_config, &cert, &key);
    let (b, b_tls) = Stack::start_tls(b_dir.path(), &b_config, &cert, &key);
    let (a_get, b_get) = (
        list_and_close(&a.key(&["--plan", "pro"])),
        list_and_close(&b.key(&["--plan", "pro"])),
    );
    let versions: [&'static SupportedProtocolVersion; 2] = [&TLS13, &TLS12];
    let client = |version| ca.client_config(b"http/1.1", &[version]);
    let mut kinds = Vec::new();
    for version in versions {
        let returning = client(version);
        kinds.push(visit(&returning, a_tls, &a_get).await);
        kinds.push(visit(&returning, b_tls, &b_get).await);
        kinds.push(visit(&returning, a_tls, &a_get).await);
    }
    assert_eq!(
        kinds,
        [Full, Resumed, Resumed].repeat(2),
        "A, then B, then A"
    );
    assert_eq!(handshakes(&b, "TLSv1.3"), [0.0, 1.0]);
    assert_eq!(handshakes(&b, "TLSv1.2"), [0.0, 1.0]);

    let reloads = |stack: &Stack, n: f64| {
        let series = "gateway_reloads_total{result=\"ok\"}";
        wait_metric(stack.admin, series, Duration::from_secs(10), |v| v >= n);
    };
    let sighup = |stack: &Stack| kill(stack.proc.pid(), Signal::SIGHUP).unwrap();
    // Holds tickets under the old key only (TLS 1.3: each ticket serves one resumption).
    let early = client(&TLS13);
    assert_eq!(visit(&early, a_tls, &a_get).await, Full);
    let returning = client(&TLS13);
    assert_eq!(visit(&returning, a_tls, &a_get).await, Full);

    // Step 1, both gateways: the new key second, decrypting only.
    for (stack, config) in [(&a, &a_config), (&b, &b_config)] {
        write_config(config, &[&old, &new]);
        sighup(stack);
        reloads(stack, 1.0);
    }
    assert_eq!(visit(&returning, b_tls, &b_get).await, Resumed);
    // Step 2, both: the new key first. A ticket under the old key still resumes, and the new
    // tickets it gets resume at the other gateway.
    for (stack, config) in [(&a, &a_config), (&b, &b_config)] {
        write_config(config, &[&new, &old]);
        sighup(stack);
        reloads(stack, 2.0);
    }
    assert_eq!(visit(&returning, a_tls, &a_get).await, Resumed);
    assert_eq!(visit(&returning, b_tls, &b_get).await, Resumed);
    // Step 3, at B: the old key dropped. The early client's ticket, under it, gets a full
    // handshake there; tickets under the new key resume.
    write_config(&b_config, &[&new]);
    sighup(&b);
    reloads(&b, 3.0);
    assert_eq!(visit(&early, b_tls, &b_get).await, Full);
    assert_eq!(visit(&returning, b_tls, &b_get).await, Resumed);

    // A damaged key file on SIGHUP: refused whole, counted, the keys in force stay.
    let short = dir.path().join("short.key");
    std::fs::write(&short, [7u8; 79]).unwrap();
    write_config(&b_config, &[&short]);
    sighup(&b);
    wait_metric(
        b.admin,
        "gateway_reloads_total{result=\"error\"}",
        Duration::from_secs(10),
        |v| v >= 1.0,
    );
    let log = b.proc.wait_log("this one holds 79");
    assert!(log.contains(&short.display().to_string()), "{log}");
    assert_eq!(visit(&returning, b_tls, &b_get).await, Resumed);
    // No key's bytes reach the log, in hex or as text.
    for file in [&old, &new] {
        let bytes = std::fs::read(file).unwrap();
        let hex: String = bytes[..8].iter().map(|b| format!("{b:02x}")).collect();
        assert!(!log.contains(&hex), "{log}");
    }
}

/// A ticket key file that is not 80 bytes stops the start and fails `check-config`, naming the
/// file, whether the file gives the TLS listener too or the command line does; keys with
/// `session_tickets = false` are a configuration error.
#[test]
fn a_ticket_key_file_that_is_no_key_is_a_clear_error_at_start_and_in_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let short = dir.path().join("short.key");
    std::fs::write(&short, b"not eighty bytes").unwrap();
    let why = "holds exactly 80 random bytes (`openssl rand 80`); this one holds 16";
    let config = dir.path().join("tickets.toml");
    write_config(&config, &[&short]);
    let tls = free_addr().to_string();
    let (code, stderr) = start_with_tls(dir.path(), &config, &tls, &cert, &key);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(why) && stderr.contains(short.to_str().unwrap()),
        "{stderr}"
    );
    let complete = dir.path().join("complete.toml");
    std::fs::write(
        &complete,
        format!(
            "{}ticket_keys = [{:?}]\n",
            tls_table(&tls, &cert, &key),
            short.display().to_string()
        ),
    )
    .unwrap();
    let (code, _, stderr) = cli(&["check-config", complete.to_str().unwrap()]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(why) && stderr.contains(short.to_str().unwrap()),
        "{stderr}"
    );
    let (code, _, stderr) = cli(&["check-config", config.to_str().unwrap()]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(why) && stderr.contains(short.to_str().unwrap()),
        "{stderr}"
    );
    std::fs::write(&short, [1u8; 80]).unwrap();
    for file in [&config, &complete] {
        let (code, _, stderr) = cli(&["check-config", file.to_str().unwrap()]);
        assert_eq!(code, 0, "{stderr}");
    }
    // Keys for tickets that are off: a contradiction, not a silent choice.
    let both = dir.path().join("both.toml");
    write_tls_config(
        &both,
        &format!(
            "ticket_keys = [{:?}]\nsession_tickets = false",
            short.display().to_string()
        ),
    );
    let (code, _, stderr) = cli(&["check-config", both.to_str().unwrap()]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("gateway.tls.ticket_keys: no keys with session_tickets = false"),
        "{stderr}"
    );
}

/// A ticket key file every user of the machine may read passes `check-config` with a warning
/// naming it, its mode and the `chmod` that closes it; one kept to its owner gets none.
#[test]
fn a_ticket_key_every_user_may_read_is_named_in_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let (open, closed) = (
        ticket_key(dir.path(), "open.key"),
        ticket_key(dir.path(), "closed.key"),
    );
    set_mode(&open, 0o604);
    set_mode(&closed, 0o600);
    let config = dir.path().join("tickets.toml");
    write_config(&config, &[&closed, &open]);
    let (code, _, stderr) = cli(&["check-config", config.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "warning: {open} holds a session ticket key, and every user of this machine may read it \
             (mode 0604): `chmod o-rwx {open}` keeps it to its owner and group\n",
            open = open.display()
        )
    );
    set_mode(&open, 0o640);
    let (code, _, stderr) = cli(&["check-config", config.to_str().unwrap()]);
    assert_eq!((code, stderr.as_str()), (0, ""));
}

/// With `session_tickets = false` the gateway gives no tickets (TLS 1.3 and 1.2): a client that
/// returns at once resumes from the gateway's cache of sessions, one that returns after 300 others
/// does not. `SIGHUP` turns tickets on again, and a return after 300 others resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_session_tickets_off_only_the_cache_of_sessions_resumes_and_sighup_turns_them_on() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(dir.path(), "server", false);
    let config = dir.path().join("off.toml");
    write_tls_config(&config, "session_tickets = false");
    let (stack, tls) = Stack::start_tls(dir.path(), &config, &cert, &key);
    let get = list_and_close(&stack.key(&["--plan", "pro"]));
    let versions: [&'static SupportedProtocolVersion; 2] = [&TLS13, &TLS12];
    for version in versions {
        let returning = ca.client_config(b"http/1.1", &[version]);
        let mut kinds = vec![visit(&returning, tls, &get).await];
        kinds.push(visit(&returning, tls, &get).await);
        three_hundred_others(&ca, tls, version).await;
        kinds.push(visit(&returning, tls, &get).await);
        assert_eq!(kinds, [Full, Resumed, Full], "{version:?}: off");
    }
    write_tls_config(&config, "session_tickets = true");
    kill(stack.proc.pid(), Signal::SIGHUP).unwrap();
    let series = "gateway_reloads_total{result=\"ok\"}";
    wait_metric(stack.admin, series, Duration::from_secs(10), |v| v >= 1.0);
    for version in versions {
        let returning = ca.client_config(b"http/1.1", &[version]);
        let mut kinds = vec![visit(&returning, tls, &get).await];
        three_hundred_others(&ca, tls, version).await;
        kinds.push(visit(&returning, tls, &get).await);
        assert_eq!(kinds, [Full, Resumed], "{version:?}: on again");
    }
}
