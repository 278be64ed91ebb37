//! The settings a gateway runs with: the configuration file's `[gateway]` section
//! ([`crate::config`]) validated. What spans several fields (route upstreams, prefixes,
//! deprecation patterns) is checked by [`Settings::new`], whose errors name the key path, e.g.
//! `gateway.routes[1].upstream`.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::access_log::AccessLog;
use crate::bans::BanPolicy;
use crate::client::TrustedProxies;
use crate::config::{CorsConfig, GatewayConfig, MIN_HEALTH_CHECK_INTERVAL_MS};
use crate::cors::CorsPolicy;
use crate::headers::HeaderCase;
use crate::plans::{MAX_LIMIT, Plans};
use crate::redis_conn::RedisTarget;
use crate::routes::{Route, Routes};
use crate::store::Fallback;
use crate::tls::TlsFiles;

mod route;

use route::route_settings;

/// Validated settings the gateway runs with.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Public listener.
    pub listen: SocketAddr,
    /// Admin listener.
    pub admin_listen: SocketAddr,
    /// Proxy worker threads.
    pub threads: usize,
    /// Idle client connections are closed after this long.
    pub keepalive_timeout: Duration,
    /// A request head must be complete this long after its first byte.
    pub header_timeout: Duration,
    /// Request body limit.
    pub max_body_bytes: u64,
    /// Request head limit (the target, header names and values together).
    pub max_header_bytes: usize,
    /// Upstream connect timeout.
    pub connect_timeout: Duration,
    /// Time between health checks of the pools' instances.
    pub health_check_every: Duration,
    /// Failure budget per address and minute.
    pub auth_failures_per_minute: u32,
    /// Key store refresh interval.
    pub key_refresh: Duration,
    /// Grace period on SIGTERM.
    pub shutdown_grace_seconds: u64,
    /// Plans.
    pub plans: Plans,
    /// Ban rules.
    pub bans: BanPolicy,
    /// Route table.
    pub routes: Routes,
    /// Redis, when keys and limits are shared.
    pub redis: Option<RedisSettings>,
    /// The HTTPS listener and its files, if any.
    pub tls: Option<(SocketAddr, TlsFiles)>,
    /// CORS outside any route's own (`/v1/rate_limit`, the pages, unrouted paths).
    pub cors: Option<Arc<CorsPolicy>>,
    /// The API's public address, without a trailing slash (`http://<listen>` when not
    /// configured), for messages; links use it only when it is configured.
    pub public_url: String,
    /// The access log's format, or off.
    pub access_log: AccessLog,
    /// How header names are written on HTTP/1.1.
    pub header_case: HeaderCase,
    /// Whose `X-Forwarded-For` and `X-Forwarded-Proto` are believed.
    pub trusted_proxies: TrustedProxies,
}

/// Validated `[gateway.redis]`.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    /// Seed URLs, and the CA that verifies them over TLS.
    pub target: RedisTarget,
    /// Time a limit decision may take in Redis.
    pub timeout: Duration,
    /// What to do without Redis.
    pub fallback: Fallback,
}

/// The seed URLs of `url`, and the CA certificates of `ca`, which only `rediss://` URLs use.
/// An error names the setting at fault (`url: ...` or `ca: ...`).
fn redis_target(url: &str, ca: Option<&Path>) -> Result<RedisTarget, String> {
    let urls = crate::redis_conn::parse_urls(url).map_err(|e| format!("url: {e}"))?;
    let ca = match ca {
        None => None,
        Some(_) if !urls.iter().all(|u| u.starts_with("rediss://")) => {
            return Err("ca: applies only to rediss:// URLs (TLS), and url has others".to_owned());
        }
        Some(path) => Some(crate::tls::ca_pem(path).map_err(|e| format!("ca: {e}"))?),
    };
    Ok(RedisTarget { urls, ca })
}

/// Refuses two of the process's sockets on one address: the second listener's bind would fail,
/// and a gateway listening where the backend does would forward to itself. One of them on
/// `0.0.0.0` (or `[::]`) takes the port for every address of its family; port 0 is the system's
/// to choose, a different one each time. Checked on the configuration a start runs with, the
/// command line's flags over the file, since a flag may move one of two addresses the file
/// gives alike.
pub fn distinct_listeners(config: &GatewayConfig, backend: SocketAddr) -> Result<(), String> {
    let mut sockets = vec![
        ("gateway.listen (--listen)", config.listen),
        ("gateway.admin_listen (--admin-listen)", config.admin_listen),
        ("backend.listen (--backend-listen)", backend),
    ];
    sockets.extend(
        config
            .tls
            .listen
            .map(|addr| ("gateway.tls.listen (--tls-listen)", addr)),
    );
    let overlap = |a: SocketAddr, b: SocketAddr| {
        a.port() == b.port()
            && a.port() != 0
            && a.is_ipv4() == b.is_ipv4()
            && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
    };
    for (i, &(name, addr)) in sockets.iter().enumerate() {
        if let Some((other, _)) = sockets[..i].iter().find(|(_, seen)| overlap(*seen, addr)) {
            return Err(format!("{name}: {addr} is taken by {other}"));
        }
    }
    Ok(())
}

impl Settings {
    /// Validates `config`; `backend` is where the `backend` upstream points.
    pub fn new(config: &GatewayConfig, backend: SocketAddr) -> Result<Settings, String> {
        for name in config.plans.0.keys() {
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            {
                return Err(format!(
                    "gateway.plans.{name}: plan names are lower-case letters, digits and `_`"
                ));
            }
        }
        for (name, plan) in &config.plans.0 {
            for limit in [plan.per_minute, plan.per_day].into_iter().flatten() {
                if limit.get() > MAX_LIMIT {
                    return Err(format!(
                        "gateway.plans.{name}: limits are at most {MAX_LIMIT} (2^53 - 1)"
                    ));
                }
            }
        }
        let redis = match &config.redis.url {
            None => None,
            Some(text) => Some(RedisSettings {
                target: redis_target(text, config.redis.ca.as_deref())
                    .map_err(|e| format!("gateway.redis.{e}"))?,
                timeout: Duration::from_millis(config.redis.timeout_ms.get()),
                fallback: config.redis.fallback,
            }),
        };
        if !config.tls.session_tickets && !config.tls.ticket_keys.is_empty() {
            return Err("gateway.tls.ticket_keys: no keys with session_tickets = false".to_owned());
        }
        let tls = match (&config.tls.listen, &config.tls.cert, &config.tls.key) {
            // Ticket keys alone: for a TLS listener given on the command line.
            (None, None, None) => None,
            (Some(listen), Some(cert), Some(key)) => Some((
                *listen,
                TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    ticket_keys: config.tls.ticket_keys.clone(),
                    session_tickets: config.tls.session_tickets,
                    min_version: config.tls.min_version,
                },
            )),
            _ => {
                return Err(
                    "gateway.tls: give listen, cert and key together (--tls-listen, --tls-cert, --tls-key)"
                        .to_owned(),
                );
            }
        };
        if config.health_check_interval_ms.get() < MIN_HEALTH_CHECK_INTERVAL_MS {
            return Err(format!(
                "gateway.health_check_interval_ms must be at least {MIN_HEALTH_CHECK_INTERVAL_MS}"
            ));
        }
        if config.bans.max_seconds < config.bans.base_seconds {
            return Err("gateway.bans.max_seconds must be at least base_seconds".to_owned());
        }
        let cors = cors_policy(&config.cors).map_err(|e| format!("gateway.cors{e}"))?;
        let public_url = match &config.public_url {
            None => format!("http://{}", config.listen),
            Some(url) if url.starts_with("http://") || url.starts_with("https://") => {
                url.trim_end_matches('/').to_owned()
            }
            Some(url) => {
                return Err(format!(
                    "gateway.public_url: `{url}` must start with http:// or https://"
                ));
            }
        };
        // Links the gateway writes are relative unless the address clients use is configured:
        // a relative link resolves against the request's own URL (RFC 8288, section 3.1), so it
        // is right on the plain and the TLS listener alike.
        let link_base = if config.public_url.is_some() {
            public_url.as_str()
        } else {
            ""
        };
        let mut routes = Vec::with_capacity(config.routes.len());
        for (i, route) in config.routes.iter().enumerate() {
            routes.push(
                route_settings(config, route, backend, link_base, cors.as_ref())
                    .map_err(|e| format!("gateway.routes[{i}]{e}"))?,
            );
        }
        let mut prefixes: Vec<&str> = routes.iter().map(|r: &Route| r.prefix.as_str()).collect();
        prefixes.sort_unstable();
        if let Some(dup) = prefixes.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("gateway.routes: prefix `{}` appears twice", dup[0]));
        }
        Ok(Settings {
            listen: config.listen,
            admin_listen: config.admin_listen,
            threads: config.threads.map_or_else(
                || std::thread::available_parallelism().map_or(1, NonZeroUsize::get),
                NonZeroUsize::get,
            ),
            keepalive_timeout: Duration::from_secs(config.keepalive_timeout_seconds.get()),
            header_timeout: Duration::from_secs(config.header_timeout_seconds.get()),
            max_body_bytes: config.max_body_bytes,
            max_header_bytes: config.max_header_bytes,
            connect_timeout: Duration::from_millis(config.connect_timeout_ms.get()),
            health_check_every: Duration::from_millis(config.health_check_interval_ms.get()),
            auth_failures_per_minute: config.auth_failures_per_minute.get(),
            key_refresh: Duration::from_millis(config.key_refresh_ms.get()),
            shutdown_grace_seconds: config.shutdown_grace_seconds,
            plans: config.plans.clone(),
            bans: BanPolicy {
                threshold: config.bans.threshold,
                base: Duration::from_secs(config.bans.base_seconds.get()),
                max: Duration::from_secs(config.bans.max_seconds.get()),
                repeat_window: Duration::from_secs(config.bans.repeat_window_seconds),
            },
            routes: Routes::new(routes),
            redis,
            tls,
            cors,
            public_url,
            access_log: config.access_log,
            header_case: config.header_case,
            trusted_proxies: TrustedProxies::parse(&config.trusted_proxies)
                .map_err(|e| format!("gateway.trusted_proxies: {e}"))?,
        })
    }
}

fn cors_policy(config: &CorsConfig) -> Result<Option<Arc<CorsPolicy>>, String> {
    CorsPolicy::new(&config.allowed_origins, config.max_age_seconds)
        .map(|p| p.map(Arc::new))
        .map_err(|e| format!(".allowed_origins: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(toml_text: &str) -> Result<Settings, String> {
        let config: GatewayConfig = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        Settings::new(&config, "127.0.0.1:8081".parse().unwrap())
    }

    #[test]
    fn defaults_route_pets_to_the_backend() {
        let s = settings("").unwrap();
        let route = s.routes.find("/v1/pets/1").unwrap();
        assert_eq!(route.upstream.instances()[0].port(), 8081);
    }

    #[test]
    fn route_errors_name_the_key() {
        let err =
            settings("[[routes]]\nprefix = \"/v1/orders\"\nupstream = \"nowhere\"\n").unwrap_err();
        assert!(err.starts_with("gateway.routes[0].upstream"), "{err}");
        let err =
            settings("[[routes]]\nprefix = \"/v1/../x\"\nupstream = \"backend\"\n").unwrap_err();
        assert!(err.starts_with("gateway.routes[0].prefix"), "{err}");
        let err = settings(
            "[[routes]]\nprefix = \"/v1/pets\"\nupstream = \"backend\"\n[[routes.deprecations]]\nmethod = \"GET\"\npath = \"/v1/pets/{id}\"\ndeprecated_at = \"yesterday\"\nsunset = \"2030-12-05T00:00:00Z\"\n",
        )
        .unwrap_err();
        assert!(
            err.starts_with("gateway.routes[0].deprecations[0].deprecated_at"),
            "{err}"
        );
        let err =
            settings("[[routes]]\nprefix = \"/v1/o\"\nupstream = \"127.0.0.1:1\"\ntls = true\n")
                .unwrap_err();
        assert!(err.starts_with("gateway.routes[0].sni"), "{err}");
        let err =
            settings("[[routes]]\nprefix = \"/v1/o\"\nupstream = \"127.0.0.1:1\"\nsni = \"x\"\n")
                .unwrap_err();
        assert!(err.starts_with("gateway.routes[0].tls"), "{err}");
        let err = settings(
            "[[routes]]\nprefix = \"/v1/o\"\nupstream = \"127.0.0.1:1\"\ntls = true\nsni = \"x\"\nca = \"/nonexistent.pem\"\n",
        )
        .unwrap_err();
        assert!(
            err.starts_with("gateway.routes[0].ca") && err.contains("/nonexistent.pem"),
            "{err}"
        );
        let err = settings("health_check_interval_ms = 50\n").unwrap_err();
        assert_eq!(err, "gateway.health_check_interval_ms must be at least 100");
        let err = settings("[bans]\nbase_seconds = 0\n").unwrap_err();
        assert!(
            err.contains("base_seconds") || err.contains("zero"),
            "{err}"
        );
    }

    #[test]
    fn two_listeners_on_one_address_are_refused_naming_both() {
        let listeners = |toml_text: &str| {
            let config: GatewayConfig = toml::from_str(toml_text).unwrap();
            distinct_listeners(&config, "127.0.0.1:8081".parse().unwrap())
        };
        listeners("").unwrap();
        let err = listeners("admin_listen = \"127.0.0.1:8081\"\n").unwrap_err();
        assert_eq!(
            err,
            "backend.listen (--backend-listen): 127.0.0.1:8081 is taken by gateway.admin_listen (--admin-listen)"
        );
        let err = listeners("listen = \"0.0.0.0:9090\"\n").unwrap_err();
        assert!(
            err.starts_with(
                "gateway.admin_listen (--admin-listen): 127.0.0.1:9090 is taken by gateway.listen"
            ),
            "{err}"
        );
        let err = listeners("[tls]\nlisten = \"127.0.0.1:8080\"\n").unwrap_err();
        assert!(
            err.starts_with("gateway.tls.listen (--tls-listen)"),
            "{err}"
        );
        listeners("listen = \"[::1]:9090\"\n").unwrap();
        listeners("listen = \"127.0.0.2:9090\"\n").unwrap();
        listeners("listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n").unwrap();
        // Not a rule of the settings alone: a flag may move one of the two.
        let config: GatewayConfig = toml::from_str("listen = \"127.0.0.1:9090\"\n").unwrap();
        Settings::new(&config, "127.0.0.1:8081".parse().unwrap()).unwrap();
    }
}
