//! Shared helpers for the integration tests: start the real `animal-store` binary on ephemeral
//! loopback ports, wait until it answers, and stop it (gracefully or with SIGKILL).

#![allow(dead_code, missing_docs)]

pub mod redis;
pub mod tls;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The binary under test, built by cargo for this test run.
pub const BIN: &str = env!("CARGO_BIN_EXE_animal-store");

/// The shipped configuration file.
pub fn shipped_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config/animal-store.toml")
}

/// A loopback address with a port the OS just handed out (and we released).
pub fn free_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().unwrap()
}

/// Waits until something accepts TCP connections on `addr`.
pub fn wait_for_port(addr: SocketAddr, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("animal-store exited early with {status}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on {addr} after 30 s");
}

/// How many times a server is started on fresh ports when a port [`free_addr`] handed out was
/// taken by another test before the server could bind it.
const START_ATTEMPTS: usize = 5;

/// Waits until `proc` listens on every one of `addrs`: its log says so (`http://<addr>` or
/// `https://<addr>`) and a connection is accepted there. `false` when it exited because one of
/// them was taken meanwhile (the window between [`free_addr`] releasing a port and the server
/// binding it, in which a test running beside this one may take it), so that the caller starts
/// it again on other ports. Any other early exit fails the test.
fn listening(proc: &mut Proc, addrs: &[SocketAddr]) -> bool {
    for addr in addrs {
        let deadline = Instant::now() + Duration::from_secs(30);
        let said = format!("://{addr}");
        while !proc.log_text().contains(&said)
            || TcpStream::connect_timeout(addr, Duration::from_millis(200)).is_err()
        {
            if let Ok(Some(status)) = proc.child.try_wait() {
                let log = proc.log_text();
                if log.contains("Address already in use") {
                    return false;
                }
                panic!("animal-store exited early with {status}:\n{log}");
            }
            assert!(
                Instant::now() < deadline,
                "nothing listens on {addr} after 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    true
}

/// A running `animal-store` process; killed when dropped.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    /// Starts `animal-store ARGS` with its stderr in `log`.
    pub fn start(args: &[&str], log: PathBuf) -> Proc {
        Self::start_after(None, args, log)
    }

    /// As [`Proc::start`], after `shell`, a bash command line (e.g. `ulimit -Sn 256`) run in the
    /// same process, which then becomes `animal-store`.
    pub fn start_after(shell: Option<&str>, args: &[&str], log: PathBuf) -> Proc {
        match shell {
            None => Self::start_under(&[], args, log),
            Some(shell) => Self::start_under(
                &["bash", "-c", &format!("{shell} && exec \"$0\" \"$@\"")],
                args,
                log,
            ),
        }
    }

    /// As [`Proc::start`], as the last arguments of `wrapper` (e.g. `strace ... --`), whose
    /// process this then is; with no wrapper, `animal-store` itself.
    pub fn start_under(wrapper: &[&str], args: &[&str], log: PathBuf) -> Proc {
        let stderr = std::fs::File::create(&log).expect("create log file");
        let mut command = match wrapper {
            [] => Command::new(BIN),
            [program, wrapper_args @ ..] => {
                let mut command = Command::new(program);
                command.args(wrapper_args).arg(BIN);
                command
            }
        };
        let child = command
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start animal-store");
        Proc { child, log }
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// SIGKILL: the process gets no chance to flush anything.
    pub fn kill9(&mut self) {
        let _ = kill(self.pid(), Signal::SIGKILL);
        let _ = self.child.wait();
    }

    /// SIGTERM and wait; returns the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        self.stop_with(Signal::SIGTERM)
    }

    /// Sends `signal` and waits for the exit; returns the exit code.
    pub fn stop_with(&mut self, signal: Signal) -> Option<i32> {
        kill(self.pid(), signal).expect("send the signal");
        self.wait_exit(signal)
    }

    /// Waits up to 30 s for the exit that `cause` (a signal already sent, or a failing start)
    /// should bring; returns the exit code.
    pub fn wait_exit(&mut self, cause: impl std::fmt::Display) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("animal-store did not exit within 30 s of {cause}");
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log, once it has `text` (within 10 s): a reload's line after the signal, a request's
    /// access line after its response.
    pub fn wait_log(&self, text: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log_text();
            if log.contains(text) {
                return log;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "`{text}` not logged in 10 s:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A failing test shows what the process last said, and whether it was still running.
            let state = match self.child.try_wait() {
                Ok(Some(status)) => format!("exited with {status}"),
                _ => "running".to_owned(),
            };
            let log = self.log_text();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!(
                "animal-store {} ({state}), last lines of its log:\n{}",
                self.child.id(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The backend alone, on an ephemeral port, over `data_dir`.
pub struct Backend {
    pub proc: Proc,
    pub addr: SocketAddr,
}

impl Backend {
    pub fn start(data_dir: &Path) -> Backend {
        Self::start_with(data_dir, &shipped_config())
    }

    pub fn start_with(data_dir: &Path, config: &Path) -> Backend {
        Self::start_under(&[], data_dir, config)
    }

    /// As [`Backend::start_with`], as the last arguments of `wrapper` ([`Proc::start_under`]).
    pub fn start_under(wrapper: &[&str], data_dir: &Path, config: &Path) -> Backend {
        for _ in 0..START_ATTEMPTS {
            let addr = free_addr();
            let log = data_dir.with_extension(format!("backend-{}.log", addr.port()));
            let mut proc = Proc::start_under(
                wrapper,
                &[
                    "backend",
                    "--config",
                    config.to_str().unwrap(),
                    "--data-dir",
                    data_dir.to_str().unwrap(),
                    "--backend-listen",
                    &addr.to_string(),
                ],
                log,
            );
            if listening(&mut proc, &[addr]) {
                return Backend { proc, addr };
            }
        }
        panic!("the backend found its port taken in each of {START_ATTEMPTS} starts");
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

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

/// Runs `animal-store ARGS` to completion; returns (exit code, stdout, stderr).
pub fn cli(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run animal-store");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The pets route of the shipped configuration, deprecation included.
pub const PETS_ROUTE: &str = r#"
[[gateway.routes]]
prefix = "/v1/pets"
upstream = "backend"

[[gateway.routes.deprecations]]
method = "GET"
path = "/v1/pets/{petId}"
deprecated_at = "2025-12-05T00:00:00Z"
sunset = "2030-12-05T00:00:00Z"
successor = "/v1/pets"
documentation = "https://github.com/animal-store/animal-store#deprecations"
"#;

/// Backend and gateway together (`animal-store serve`) on ephemeral ports.
pub struct Stack {
    pub proc: Proc,
    pub listen: SocketAddr,
    pub backend: SocketAddr,
    pub admin: SocketAddr,
    pub data_dir: PathBuf,
    pub config: PathBuf,
}

impl Stack {
    /// A stack over a fresh data directory in `dir`, with the shipped configuration.
    pub fn start(dir: &Path) -> Stack {
        Self::start_with(dir, &shipped_config())
    }

    /// A stack whose configuration is the shipped one's `[backend]` defaults plus `gateway_toml`
    /// (which holds `[gateway]` keys first, then any tables).
    pub fn start_with_text(dir: &Path, gateway_toml: &str) -> Stack {
        Self::start_with(dir, &Self::config_with_text(dir, gateway_toml))
    }

    /// The configuration file of [`Stack::start_with_text`], written in `dir`.
    pub fn config_with_text(dir: &Path, gateway_toml: &str) -> PathBuf {
        let config = dir.join("test-config.toml");
        std::fs::write(
            &config,
            format!("[gateway]\nkey_refresh_ms = 200\n{gateway_toml}"),
        )
        .unwrap();
        config
    }

    /// A stack over a fresh data directory in `dir`, with the configuration file `config`.
    pub fn start_with(dir: &Path, config: &Path) -> Stack {
        let data_dir = dir.join("data");
        // Issue a key first, so that `serve` does not print a first-run key.
        Self::key_in(&data_dir, config, &["--plan", "pro", "--name", "setup"]);
        Self::launch(dir, data_dir, config)
    }

    /// A stack over a fresh data directory that also serves HTTPS, with `cert` and `key`, on a
    /// fresh port; returns that address too.
    pub fn start_tls(dir: &Path, config: &Path, cert: &Path, key: &Path) -> (Stack, SocketAddr) {
        let data_dir = dir.join("data");
        // As in `start_with`: no first-run key.
        Self::key_in(&data_dir, config, &["--plan", "pro", "--name", "setup"]);
        let (stack, tls) = Self::launch_ports(None, dir, data_dir, config, &[], Some((cert, key)));
        (stack, tls.unwrap())
    }

    /// `serve` over `data_dir` exactly as it is (an empty one gets a first-run key).
    pub fn launch(dir: &Path, data_dir: PathBuf, config: &Path) -> Stack {
        Self::launch_after(None, dir, data_dir, config, &[])
    }

    /// `serve` over `data_dir` with more flags, started after `shell` ([`Proc::start_after`]).
    pub fn launch_after(
        shell: Option<&str>,
        dir: &Path,
        data_dir: PathBuf,
        config: &Path,
        extra: &[&str],
    ) -> Stack {
        Self::launch_ports(shell, dir, data_dir, config, extra, None).0
    }

    /// As [`Stack::launch_after`], serving HTTPS too with `tls` (certificate and key files) on a
    /// port of its own, whose address is returned. Every port is fresh, and all are chosen again
    /// when one was taken.
    fn launch_ports(
        shell: Option<&str>,
        dir: &Path,
        data_dir: PathBuf,
        config: &Path,
        extra: &[&str],
        tls: Option<(&Path, &Path)>,
    ) -> (Stack, Option<SocketAddr>) {
        for _ in 0..START_ATTEMPTS {
            let (listen, backend, admin) = (free_addr(), free_addr(), free_addr());
            let mut args: Vec<String> = [
                "serve",
                "--config",
                config.to_str().unwrap(),
                "--data-dir",
                data_dir.to_str().unwrap(),
                "--listen",
                &listen.to_string(),
                "--backend-listen",
                &backend.to_string(),
                "--admin-listen",
                &admin.to_string(),
            ]
            .map(str::to_owned)
            .to_vec();
            let mut addrs = vec![listen, admin, backend];
            let tls_listen = tls.map(|(cert, key)| {
                let addr = free_addr();
                args.extend(
                    [
                        "--tls-listen",
                        &addr.to_string(),
                        "--tls-cert",
                        cert.to_str().unwrap(),
                        "--tls-key",
                        key.to_str().unwrap(),
                    ]
                    .map(str::to_owned),
                );
                addrs.push(addr);
                addr
            });
            args.extend(extra.iter().map(|s| (*s).to_owned()));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let log = dir.join(format!("serve-{}.log", listen.port()));
            let mut proc = Proc::start_after(shell, &args, log);
            if listening(&mut proc, &addrs) {
                let stack = Stack {
                    proc,
                    listen,
                    backend,
                    admin,
                    data_dir,
                    config: config.to_owned(),
                };
                return (stack, tls_listen);
            }
        }
        panic!("serve found a port taken in each of {START_ATTEMPTS} starts");
    }

    fn key_in(data_dir: &Path, config: &Path, args: &[&str]) -> String {
        let mut all = vec![
            "keys",
            "create",
            "--config",
            config.to_str().unwrap(),
            "--data-dir",
            data_dir.to_str().unwrap(),
        ];
        all.extend_from_slice(args);
        let (code, stdout, stderr) = cli(&all);
        assert_eq!(code, 0, "keys create failed: {stderr}");
        stdout.trim().to_owned()
    }

    /// Issues a key with `keys create ARGS` and waits until the running gateway uses it.
    pub fn key(&self, args: &[&str]) -> String {
        let loads = metric(self.admin, "gateway_key_loads_total").unwrap_or(0.0);
        let key = Self::key_in(&self.data_dir, &self.config, args);
        wait_metric(
            self.admin,
            "gateway_key_loads_total",
            Duration::from_secs(10),
            |v| v > loads,
        );
        key
    }

    /// Waits until the gateway's `gateway_active_keys` equals the unrevoked keys in the store;
    /// reads only the admin listener, so no limit or budget is spent.
    pub fn wait_keys_loaded(&self) {
        let (_, list, _) = self.keys_cli(&["list", "--json"]);
        let keys: Vec<serde_json::Value> = serde_json::from_str(&list).expect("keys list --json");
        let now = std::time::SystemTime::now();
        let usable = keys
            .iter()
            .filter(|k| k["revoked"].is_null())
            .filter(|k| {
                k["expires"]
                    .as_str()
                    .is_none_or(|e| humantime::parse_rfc3339(e).unwrap() > now)
            })
            .count();
        let want = format!("gateway_active_keys {usable}\n");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let (_, _, body) = raw_http(
                self.admin,
                b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            );
            if body.contains(&want) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the gateway did not load the new key within 10 s");
    }

    /// Issues an enterprise key with its own limits and waits until the gateway uses it.
    pub fn enterprise_key(&self, per_minute: u32, per_day: u32) -> String {
        let (m, d) = (per_minute.to_string(), per_day.to_string());
        self.key(&["--plan", "enterprise", "--per-minute", &m, "--per-day", &d])
    }

    /// `GET path` through the gateway with `key` as the bearer.
    pub async fn get(&self, c: &reqwest::Client, path: &str, key: &str) -> reqwest::Response {
        c.get(self.url(path)).bearer_auth(key).send().await.unwrap()
    }

    /// Runs `animal-store keys ARGS` against this stack's data directory.
    pub fn keys_cli(&self, args: &[&str]) -> (i32, String, String) {
        let mut all = vec!["keys"];
        all.extend_from_slice(args);
        all.extend_from_slice(&[
            "--config",
            self.config.to_str().unwrap(),
            "--data-dir",
            self.data_dir.to_str().unwrap(),
        ]);
        cli(&all)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.listen, path)
    }
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

/// A tiny upstream for routing tests: answers every request with 200 and a JSON echo of its
/// path and headers, after an optional delay; counts the requests it saw and the connections
/// they came on.
pub struct TestUpstream {
    pub addr: SocketAddr,
    pub hits: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The key exchange group and handshake kind of each TLS connection accepted, in order.
    groups: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stop: tokio::sync::watch::Sender<bool>,
    /// Ends (`recv` gives `None`) when the listener and every connection are closed: each task
    /// holds a sender.
    running: tokio::sync::Mutex<tokio::sync::mpsc::Receiver<()>>,
}

impl TestUpstream {
    pub async fn start(delay: Duration) -> TestUpstream {
        Self::start_with(delay, None).await
    }

    /// An upstream that speaks HTTPS with `tls` (see [`tls::TestCa::acceptor`]).
    pub async fn start_tls(tls: tokio_rustls::TlsAcceptor) -> TestUpstream {
        Self::start_with(Duration::ZERO, Some(tls)).await
    }

    async fn start_with(delay: Duration, tls: Option<tokio_rustls::TlsAcceptor>) -> TestUpstream {
        Self::serve("127.0.0.1:0".parse().unwrap(), delay, tls).await
    }

    /// An upstream on `addr` (to bring one back where it was).
    pub async fn start_at(addr: SocketAddr) -> TestUpstream {
        Self::serve(addr, Duration::ZERO, None).await
    }

    /// Closes the listener and every connection, and returns when they are closed: the
    /// instance is gone, and cannot answer a request sent after this.
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        let _ = self.running.lock().await.recv().await;
    }

    async fn serve(
        addr: SocketAddr,
        delay: Duration,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> TestUpstream {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = hits.clone();
        let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let accepts = connections.clone();
        let groups = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let agreed = groups.clone();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mut accept_stopped = stopped.clone();
        let (alive, running) = tokio::sync::mpsc::channel::<()>(1);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = accept_stopped.changed() => break,
                };
                let Ok((stream, _)) = accepted else {
                    break;
                };
                accepts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (counter, tls, agreed) = (counter.clone(), tls.clone(), agreed.clone());
                let mut conn_stopped = stopped.clone();
                let alive = alive.clone();
                tokio::spawn(async move {
                    let serve = async move {
                        match tls {
                            None => echo(stream, counter, delay).await,
                            Some(tls) => {
                                if let Ok(stream) = tls.accept(stream).await {
                                    let tls = stream.get_ref().1;
                                    let group = tls.negotiated_key_exchange_group();
                                    agreed.lock().unwrap().push(format!(
                                        "{:?} {:?}",
                                        group.map(|g| g.name()),
                                        tls.handshake_kind()
                                    ));
                                    echo(stream, counter, delay).await;
                                }
                            }
                        }
                    };
                    tokio::select! {
                        () = serve => {}
                        _ = conn_stopped.changed() => {}
                    }
                    drop(alive);
                });
            }
            drop(listener);
            drop(alive);
        });
        TestUpstream {
            addr,
            hits,
            connections,
            groups,
            stop,
            running: tokio::sync::Mutex::new(running),
        }
    }

    /// The key exchange group each TLS connection agreed on and how its handshake went, as
    /// `Some(GROUP) Some(KIND)`, in order.
    pub fn key_exchange_groups(&self) -> Vec<String> {
        self.groups.lock().unwrap().clone()
    }

    pub fn hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How many connections it has accepted.
    pub fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Answers each request on `stream` with 200 and a JSON echo of its path and headers (`HEAD`
/// with the head alone).
async fn echo<S>(
    stream: S,
    counter: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    delay: Duration,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let mut stream = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if stream.read_line(&mut request_line).await.unwrap_or(0) == 0 {
            return;
        }
        let mut headers = serde_json::Map::new();
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((n, v)) = line.split_once(':') {
                let n = n.trim().to_ascii_lowercase();
                if n == "content-length" {
                    length = v.trim().parse().unwrap_or(0);
                }
                headers.insert(n, serde_json::Value::String(v.trim().to_owned()));
            }
        }
        let mut body = vec![0u8; length];
        if stream.read_exact(&mut body).await.is_err() {
            return;
        }
        counter.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(delay).await;
        let path = request_line.split(' ').nth(1).unwrap_or("").to_owned();
        let echo = serde_json::json!({"path": path, "headers": headers}).to_string();
        // The answer to HEAD is GET's head alone (RFC 9110, section 9.3.2).
        let body = if request_line.starts_with("HEAD ") {
            ""
        } else {
            &echo
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            echo.len()
        );
        if stream
            .get_mut()
            .write_all(response.as_bytes())
            .await
            .is_err()
        {
            return;
        }
        let _ = stream.get_mut().flush().await;
    }
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
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

/// A request head read from `stream` a byte at a time (so that nothing after it is read), up to
/// and with its blank line; `None` if the stream ends or fails first.
pub fn read_request_head(stream: &mut impl std::io::Read) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).unwrap_or(0) == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    Some(head)
}

/// An upstream that reads one request head and never answers. The first receiver gets a message
/// when the head has arrived; the second says what became of the connection within 10 s after
/// it: `"closed"` (the gateway closed it), `"more bytes"` or `"still open after 10 s"`.
pub fn silent_upstream() -> (
    SocketAddr,
    std::sync::mpsc::Receiver<()>,
    std::sync::mpsc::Receiver<&'static str>,
) {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (arrived, head_read) = std::sync::mpsc::channel();
    let (saw, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else {
            return;
        };
        if read_request_head(&mut stream).is_none() {
            return;
        }
        let _ = arrived.send(());
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let _ = saw.send(match stream.read(&mut [0u8; 1]) {
            Ok(0) => "closed",
            Ok(_) => "more bytes",
            Err(_) => "still open after 10 s",
        });
    });
    (addr, head_read, seen)
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

/// The gateway alone (`animal-store gateway`), in front of a backend started separately, with
/// a data directory of its own.
pub struct GatewayOnly {
    pub proc: Proc,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub data_dir: PathBuf,
}

impl GatewayOnly {
    /// Starts a gateway named `name` under `dir` with `config`, its `backend` upstream at
    /// `backend`, and more flags in `extra` (e.g. `--redis-url`).
    pub fn start(
        dir: &Path,
        name: &str,
        config: &Path,
        backend: SocketAddr,
        extra: &[&str],
    ) -> GatewayOnly {
        let data_dir = dir.join(format!("gateway-{name}"));
        for _ in 0..START_ATTEMPTS {
            let (listen, admin) = (free_addr(), free_addr());
            let mut args = vec![
                "gateway".to_owned(),
                "--config".to_owned(),
                config.to_str().unwrap().to_owned(),
                "--data-dir".to_owned(),
                data_dir.to_str().unwrap().to_owned(),
                "--listen".to_owned(),
                listen.to_string(),
                "--admin-listen".to_owned(),
                admin.to_string(),
                "--backend-listen".to_owned(),
                backend.to_string(),
            ];
            args.extend(extra.iter().map(|s| (*s).to_owned()));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut proc = Proc::start(&args, dir.join(format!("gateway-{name}.log")));
            if listening(&mut proc, &[listen, admin]) {
                return GatewayOnly {
                    proc,
                    listen,
                    admin,
                    data_dir,
                };
            }
        }
        panic!("the gateway found a port taken in each of {START_ATTEMPTS} starts");
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.listen, path)
    }

    /// Waits until this gateway uses exactly `n` keys.
    pub fn wait_keys(&self, n: usize) {
        wait_metric(
            self.admin,
            "gateway_active_keys",
            Duration::from_secs(10),
            |v| v == n as f64,
        );
    }
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
