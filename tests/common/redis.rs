//! Real Redis servers for the tests: `redis-server` processes on ephemeral loopback ports, in a
//! temporary directory each, and a three-master Redis Cluster made with `redis-cli --cluster
//! create`. Where `redis-server` is missing the tests fail and say how to install it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{START_ATTEMPTS, free_addr};

const INSTALL: &str = "redis-server and redis-cli are needed for this test: \
                       apt-get install -y redis-server redis-tools";

fn require(binary: &str) {
    let found = Command::new(binary)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(found, "`{binary}` not found. {INSTALL}");
}

/// One `redis-server` on a loopback port; killed when dropped.
pub struct RedisServer {
    child: Option<Child>,
    pub addr: SocketAddr,
    dir: PathBuf,
    extra: Vec<String>,
    /// Set for a server that speaks only TLS.
    tls: Option<RedisTls>,
    _tmp: Option<tempfile::TempDir>,
}

/// The files of a Redis that speaks only TLS: its certificate chain and key, and the CA that
/// signed them (which `redis-cli` trusts).
struct RedisTls {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl RedisServer {
    /// A server with an append-only file, so a restart keeps what was written.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// A server with more `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        Self::start_fresh(|| extra.iter().map(|s| (*s).to_owned()).collect())
    }

    /// A server on a fresh port, with `extra()` as more arguments (which may name fresh ports of
    /// their own, as a cluster bus port). Started again on other ports when one was taken by a
    /// test running beside this one between [`free_addr`] handing it out and Redis binding it.
    fn start_fresh(extra: impl Fn() -> Vec<String>) -> RedisServer {
        Self::start_fresh_with(extra, || None)
    }

    /// A server that speaks only TLS (`rediss://`), presenting `cert` (a chain) and `key`, which
    /// `ca` signed.
    pub fn start_tls(ca: &Path, cert: &Path, key: &Path) -> RedisServer {
        Self::start_fresh_with(Vec::new, || {
            Some(RedisTls {
                ca: ca.to_owned(),
                cert: cert.to_owned(),
                key: key.to_owned(),
            })
        })
    }

    fn start_fresh_with(
        extra: impl Fn() -> Vec<String>,
        tls: impl Fn() -> Option<RedisTls>,
    ) -> RedisServer {
        for _ in 0..START_ATTEMPTS {
            let mut server = Self::new(free_addr(), extra());
            server.tls = tls();
            if server.launch() {
                return server;
            }
        }
        panic!("redis-server found a port taken in each of {START_ATTEMPTS} starts");
    }

    /// A server on `addr` (one a gateway was told about before Redis was there).
    pub fn start_at(addr: SocketAddr, extra: &[&str]) -> RedisServer {
        let mut server = Self::new(addr, extra.iter().map(|s| (*s).to_owned()).collect());
        assert!(
            server.launch(),
            "{addr} was taken before redis-server could bind it"
        );
        server
    }

    fn new(addr: SocketAddr, extra: Vec<String>) -> RedisServer {
        require("redis-server");
        let tmp = tempfile::tempdir().unwrap();
        RedisServer {
            child: None,
            addr,
            dir: tmp.path().to_owned(),
            extra,
            tls: None,
            _tmp: Some(tmp),
        }
    }

    /// Starts `redis-server` and waits until it answers `PING`. `false` when it exited because a
    /// port it was given is in use; any other early exit, or no answer in 20 s, fails the test
    /// with Redis's own log.
    fn launch(&mut self) -> bool {
        let log_path = self.dir.join("redis.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let port = self.addr.port().to_string();
        let ports: Vec<&str> = match &self.tls {
            None => vec!["--port", &port],
            Some(tls) => vec![
                "--port",
                "0",
                "--tls-port",
                &port,
                "--tls-cert-file",
                tls.cert.to_str().unwrap(),
                "--tls-key-file",
                tls.key.to_str().unwrap(),
                "--tls-ca-cert-file",
                tls.ca.to_str().unwrap(),
                "--tls-auth-clients",
                "no",
            ],
        };
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1"])
            .args(ports)
            .args(["--dir", self.dir.to_str().unwrap()])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .args(&self.extra)
            .stdout(log)
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start redis-server: {e}. {INSTALL}"));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.answers() {
            let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                let log = log();
                if log.contains("Address already in use") {
                    return false;
                }
                panic!(
                    "redis-server on {} exited early with {status}:\n{log}",
                    self.addr
                );
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on {} did not answer PING within 20 s:\n{}",
                self.addr,
                log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// `redis://`, or `rediss://` for a server that speaks TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// SIGKILL: Redis is gone at once, as in a crash or a partition.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and directory (with what its append-only file kept).
    pub fn restart(&mut self) {
        self.kill();
        assert!(
            self.launch(),
            "{} was taken before redis-server could bind it again",
            self.addr
        );
    }

    /// Whether the server answers `PING` now.
    fn answers(&self) -> bool {
        match &self.tls {
            None => pong(self.addr),
            Some(_) => self.cli(&["PING"]).trim() == "PONG",
        }
    }

    /// `redis-cli`'s arguments for speaking TLS to this server, if it does.
    fn tls_args(&self) -> Vec<&str> {
        match &self.tls {
            None => Vec::new(),
            Some(tls) => vec!["--tls", "--cacert", tls.ca.to_str().unwrap()],
        }
    }

    /// Runs `redis-cli` against this server; returns its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        require("redis-cli");
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.addr.port().to_string()])
            .args(self.tls_args())
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli: {e}. {INSTALL}"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether a Redis answers `PING` on `addr` now.
fn pong(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// A Redis Cluster of three masters on loopback, slots spread by `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        require("redis-cli");
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_fresh(|| {
                    let bus = free_addr().port().to_string();
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-port",
                        &bus,
                        "--cluster-node-timeout",
                        "2000",
                    ]
                    .map(str::to_owned)
                    .to_vec()
                })
            })
            .collect();
        let addrs: Vec<String> = nodes.iter().map(|n| n.addr.to_string()).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli: {e}. {INSTALL}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while !nodes
            .iter()
            .all(|n| n.cli(&["cluster", "info"]).contains("cluster_state:ok"))
        {
            assert!(
                Instant::now() < deadline,
                "the cluster did not become ok in 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        RedisCluster { nodes }
    }

    /// The URL of one node: the gateway finds the others by itself.
    pub fn url(&self) -> String {
        self.nodes[0].url()
    }
}
