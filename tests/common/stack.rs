//! The gateway under test: `animal-store serve` (backend and gateway) and the gateway alone, on
//! ephemeral loopback ports, with the shipped configuration or a test's own.

use super::*;

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
        Self::start_after(None, dir, name, config, backend, extra)
    }

    /// As [`GatewayOnly::start`], after `shell` ([`Proc::start_after`]).
    pub fn start_after(
        shell: Option<&str>,
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
            let mut proc = Proc::start_after(shell, &args, dir.join(format!("gateway-{name}.log")));
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
