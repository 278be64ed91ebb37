//! Shared helpers for the integration tests: start the real `animal-store` binary on ephemeral
//! loopback ports, wait until it answers, and stop it (gracefully or with SIGKILL). What the tests
//! start and talk to is in the modules below (`stack`, `upstreams`, `http`), re-exported here;
//! `redis` and `tls` are named by the tests that need them.

#![allow(dead_code, missing_docs)]

mod http;
pub mod redis;
mod stack;
pub mod tls;
mod upstreams;

// Each test binary uses some of them, as with the helpers themselves (`dead_code` above).
#[allow(unused_imports)]
pub use {http::*, stack::*, upstreams::*};

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The binary under test, built by cargo for this test run.
pub const BIN: &str = env!("CARGO_BIN_EXE_animal-store");

/// The environment variable `--redis-url` may come from: taken out of every process the tests
/// start, so that a developer's own cannot turn a test of the embedded store into one of Redis.
/// A test that wants it sets it itself.
pub const REDIS_URL_ENV: &str = "ANIMAL_STORE_REDIS_URL";

/// The shipped configuration file.
pub fn shipped_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config/animal-store.toml")
}

/// A loopback address with a port the OS just handed out (and we released), never one this
/// process handed out before: the OS may give a released port again at once, and a server given
/// one port for two of its listeners refuses to start (the gateway checks that they differ).
pub fn free_addr() -> SocketAddr {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let addr = listener.local_addr().unwrap();
        if !handed_out.contains(&addr.port()) {
            handed_out.push(addr.port());
            return addr;
        }
    }
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
            .env_remove(REDIS_URL_ENV)
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

/// Runs `animal-store ARGS` to completion; returns (exit code, stdout, stderr).
pub fn cli(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove(REDIS_URL_ENV)
        .output()
        .expect("run animal-store");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}
