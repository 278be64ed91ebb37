//! Shared helpers for the integration tests: start the real `animal-store` binary on ephemeral
//! loopback ports, wait until it answers, and stop it (gracefully or with SIGKILL).

#![allow(dead_code, missing_docs)]

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

/// A running `animal-store` process; killed when dropped.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    /// Starts `animal-store ARGS` with its stderr in `log`.
    pub fn start(args: &[&str], log: PathBuf) -> Proc {
        let stderr = std::fs::File::create(&log).expect("create log file");
        let child = Command::new(BIN)
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
        kill(self.pid(), Signal::SIGTERM).expect("send SIGTERM");
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("animal-store did not exit within 30 s of SIGTERM");
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
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
        let addr = free_addr();
        let log = data_dir.with_extension(format!("backend-{}.log", addr.port()));
        let mut proc = Proc::start(
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
        wait_for_port(addr, &mut proc.child);
        Backend { proc, addr }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

/// An HTTP client that never follows redirects and never reuses a stale pool across restarts.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
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
