//! The `[gateway]` section of the configuration file, and its validation into [`Settings`].
//!
//! Types, ranges and unknown keys are checked by serde while parsing (so the TOML error carries
//! the line); what spans several fields (route upstreams, prefixes, deprecation patterns) is
//! checked by [`Settings::new`], whose errors name the key path, e.g. `gateway.routes[1].upstream`.

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::access_log::AccessLog;
use crate::bans::BanPolicy;
use crate::client::TrustedProxies;
use crate::cors::CorsPolicy;
use crate::deprecation::{AfterSunset, Deprecation};
use crate::plans::{MAX_LIMIT, Plans};
use crate::routes::{Route, Routes, Upstream, UpstreamTls, normalize_path};
use crate::store::Fallback;
use crate::store::redis::DEFAULT_TIMEOUT_MS;
use crate::tls::TlsFiles;
use pingora::lb::LoadBalancer;
use pingora::lb::health_check::TcpHealthCheck;
use pingora::lb::selection::RoundRobin;

/// Default public listener.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default admin listener (`/metrics`, `/healthz`, `/readyz`).
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9090";
/// Default request body limit: 1 MiB.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 1024 * 1024;
/// Default limit on a request's header names and values together: 16 KiB.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 16 * 1024;
/// Most request headers forwarded. Upstreams on hyper (the backend among them) answer more than
/// 100 with a bare 431, so the gateway refuses them first, with the contract's error body.
pub const MAX_HEADERS: usize = 100;
/// Default time an upstream may take to answer.
pub const DEFAULT_UPSTREAM_TIMEOUT_MS: u64 = 10_000;
/// Default time to establish an upstream connection.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 2_000;
/// Default failed authentications per address and minute.
pub const DEFAULT_AUTH_FAILURES_PER_MINUTE: u32 = 60;
/// Default interval at which the key store file is checked for changes.
pub const DEFAULT_KEY_REFRESH_MS: u64 = 500;
/// Default idle time after which a client connection is closed, as nginx's default is 75 s.
pub const DEFAULT_KEEPALIVE_TIMEOUT_SECONDS: u64 = 60;
/// Default time a request head may take once its first byte is in (HAProxy's usual
/// `timeout http-request`; a real client sends its head at once).
pub const DEFAULT_HEADER_TIMEOUT_SECONDS: u64 = 10;
/// How long a pool's health check waits for a connection.
pub const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_millis(500);
/// The upstream name that means "the backend of this deployment" (`--backend-listen`).
pub const BACKEND_UPSTREAM: &str = "backend";

/// `[gateway]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// The public listener (`/v1/...`).
    pub listen: SocketAddr,
    /// `/metrics` (Prometheus), `/healthz`, `/readyz`.
    pub admin_listen: SocketAddr,
    /// Worker threads of the proxy; unset: one per CPU the process may use (so a gateway pinned
    /// to one core runs one thread, as nginx runs one worker per core).
    pub threads: Option<NonZeroUsize>,
    /// A client connection idle this long between requests is closed (nginx's
    /// `keepalive_timeout`); HTTP/2 connections too.
    pub keepalive_timeout_seconds: NonZeroU64,
    /// A plain-HTTP request head not complete this long after its first byte closes the
    /// connection (nginx's `client_header_timeout`), so slow clients cannot hold sessions.
    pub header_timeout_seconds: NonZeroU64,
    /// Request bodies over this many bytes get 413 without reaching an upstream.
    pub max_body_bytes: u64,
    /// Requests whose header names and values exceed this many bytes get 400 `invalid_request`.
    pub max_header_bytes: usize,
    /// Default time an upstream may take to answer before the client gets 504.
    pub upstream_timeout_ms: NonZeroU64,
    /// Time to establish an upstream connection before the client gets 502.
    pub connect_timeout_ms: NonZeroU64,
    /// Failed authentications per client address and minute before 429 `too_many_auth_failures`.
    pub auth_failures_per_minute: NonZeroU32,
    /// How often the key store is checked for changes; keys take effect within this time.
    pub key_refresh_ms: NonZeroU64,
    /// On SIGTERM, how long the gateway keeps serving before it stops (pingora's grace period).
    pub shutdown_grace_seconds: u64,
    /// Plans and their limits, `[gateway.plans.NAME]`.
    pub plans: Plans,
    /// `[gateway.bans]`.
    pub bans: BansConfig,
    /// `[[gateway.routes]]`: path prefixes and their upstreams.
    pub routes: Vec<RouteConfig>,
    /// `[gateway.redis]`: share keys and limits with other gateways.
    pub redis: RedisConfig,
    /// `[gateway.tls]`: an HTTPS listener beside the plain one.
    pub tls: TlsConfig,
    /// `[gateway.cors]`: origins whose web pages may call the API.
    pub cors: CorsConfig,
    /// The access log: `off`, `text` or `json` (one object per line).
    pub access_log: AccessLog,
    /// Load balancers (CIDRs) whose `X-Forwarded-For` is believed; empty: none.
    pub trusted_proxies: Vec<String>,
    /// The address clients use for this API, e.g. `https://api.example.com`; links the gateway
    /// writes (a deprecation's documentation, the docs page) are built from it, so they are
    /// right behind a load balancer or a TLS terminator. Unset: `http://<listen>`.
    pub public_url: Option<String>,
}

/// `[gateway.cors]`, or a route's `cors` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CorsConfig {
    /// Origins (`https://app.example`) allowed to call the API from a browser; empty: CORS off.
    pub allowed_origins: Vec<String>,
    /// How long a browser may reuse a preflight's answer (`Access-Control-Max-Age`).
    pub max_age_seconds: u64,
}

impl Default for CorsConfig {
    fn default() -> Self {
        CorsConfig {
            allowed_origins: Vec::new(),
            max_age_seconds: crate::cors::DEFAULT_MAX_AGE_SECONDS,
        }
    }
}

/// `[gateway.tls]`: all three keys, or none.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// Where HTTPS (HTTP/2 and HTTP/1.1 by ALPN) is served (`--tls-listen`).
    pub listen: Option<SocketAddr>,
    /// PEM certificate chain, leaf first (`--tls-cert`).
    pub cert: Option<std::path::PathBuf>,
    /// PEM private key of the certificate (`--tls-key`).
    pub key: Option<std::path::PathBuf>,
}

/// `[gateway.redis]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// `redis://host:port[/db]`, or several seed nodes of a cluster separated by commas. Unset:
    /// keys and limits stay in the data directory (`--redis-url` sets it too).
    pub url: Option<String>,
    /// A limit decision Redis has not answered within this many milliseconds is made by the
    /// fallback instead.
    pub timeout_ms: NonZeroU64,
    /// While Redis cannot decide: `local` (this gateway's share of each limit), `allow`, `deny`.
    pub fallback: Fallback,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: None,
            timeout_ms: NonZeroU64::new(DEFAULT_TIMEOUT_MS).expect("non-zero"),
            fallback: Fallback::Local,
        }
    }
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            listen: DEFAULT_LISTEN.parse().expect("valid default"),
            admin_listen: DEFAULT_ADMIN_LISTEN.parse().expect("valid default"),
            threads: None,
            keepalive_timeout_seconds: NonZeroU64::new(DEFAULT_KEEPALIVE_TIMEOUT_SECONDS)
                .expect("non-zero"),
            header_timeout_seconds: NonZeroU64::new(DEFAULT_HEADER_TIMEOUT_SECONDS)
                .expect("non-zero"),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            upstream_timeout_ms: NonZeroU64::new(DEFAULT_UPSTREAM_TIMEOUT_MS).expect("non-zero"),
            connect_timeout_ms: NonZeroU64::new(DEFAULT_CONNECT_TIMEOUT_MS).expect("non-zero"),
            auth_failures_per_minute: NonZeroU32::new(DEFAULT_AUTH_FAILURES_PER_MINUTE)
                .expect("non-zero"),
            key_refresh_ms: NonZeroU64::new(DEFAULT_KEY_REFRESH_MS).expect("non-zero"),
            shutdown_grace_seconds: 1,
            plans: Plans::defaults(),
            bans: BansConfig::default(),
            routes: vec![RouteConfig {
                prefix: "/v1/pets".to_owned(),
                upstream: Some(BACKEND_UPSTREAM.to_owned()),
                upstreams: Vec::new(),
                timeout_ms: None,
                deprecations: Vec::new(),
                tls: false,
                sni: None,
                ca: None,
                cors: None,
            }],
            redis: RedisConfig::default(),
            tls: TlsConfig::default(),
            cors: CorsConfig::default(),
            access_log: AccessLog::Off,
            trusted_proxies: Vec::new(),
            public_url: None,
        }
    }
}

/// `[gateway.bans]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BansConfig {
    /// Refusals (429) tolerated within one minute window; one more bans the key.
    pub threshold: u32,
    /// Length of a first ban, in seconds.
    pub base_seconds: NonZeroU64,
    /// Longest ban, in seconds.
    pub max_seconds: NonZeroU64,
    /// A ban within this many seconds of the previous one lasts twice as long.
    pub repeat_window_seconds: u64,
}

impl Default for BansConfig {
    fn default() -> Self {
        let policy = BanPolicy::default();
        BansConfig {
            threshold: policy.threshold,
            base_seconds: NonZeroU64::new(policy.base.as_secs()).expect("non-zero"),
            max_seconds: NonZeroU64::new(policy.max.as_secs()).expect("non-zero"),
            repeat_window_seconds: policy.repeat_window.as_secs(),
        }
    }
}

/// `[[gateway.routes]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Path prefix under `/v1`, e.g. `/v1/store/orders`; matched at segment boundaries.
    pub prefix: String,
    /// `backend` (this deployment's backend) or a `host:port` address; or leave it out and
    /// name several instances in `upstreams`.
    #[serde(default)]
    pub upstream: Option<String>,
    /// A pool of instances (`["127.0.0.1:9101", "127.0.0.1:9102"]`): balanced round-robin,
    /// health-checked every second, a refused connection retried once on another instance.
    #[serde(default)]
    pub upstreams: Vec<String>,
    /// Overrides `gateway.upstream_timeout_ms` for this route.
    pub timeout_ms: Option<NonZeroU64>,
    /// Deprecated operations within this route.
    #[serde(default)]
    pub deprecations: Vec<DeprecationConfig>,
    /// Speak HTTPS to the upstream (HTTP/1.1 over TLS), verifying its certificate.
    #[serde(default)]
    pub tls: bool,
    /// With `tls`: the name on the upstream's certificate (sent as SNI, and verified).
    pub sni: Option<String>,
    /// With `tls`: a PEM file of CA certificates to verify the upstream with, instead of the
    /// system's roots.
    pub ca: Option<std::path::PathBuf>,
    /// CORS for this route instead of `[gateway.cors]` (an empty list turns it off here).
    pub cors: Option<CorsConfig>,
}

/// `[[gateway.routes.deprecations]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeprecationConfig {
    /// The HTTP method, e.g. `GET`.
    pub method: String,
    /// Path pattern; `{name}` stands for one segment, e.g. `/v1/pets/{petId}`.
    pub path: String,
    /// When the operation was deprecated (RFC 3339, e.g. `2025-12-05T00:00:00Z`).
    pub deprecated_at: String,
    /// When it is removed (RFC 3339).
    pub sunset: String,
    /// The operation that replaces it, for `Link: rel="successor-version"`.
    pub successor: Option<String>,
    /// Documentation of the deprecation, for `Link: rel="deprecation"`; a path such as
    /// `/v1/docs#operation/getPet` is made absolute with `gateway.public_url`.
    pub documentation: Option<String>,
    /// `gone` (answer 410 after the sunset, the default) or `forward`.
    #[serde(default = "default_after_sunset")]
    pub after_sunset: AfterSunset,
}

fn default_after_sunset() -> AfterSunset {
    AfterSunset::Gone
}

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
    /// Request header limit (names and values together).
    pub max_header_bytes: usize,
    /// Upstream connect timeout.
    pub connect_timeout: Duration,
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
    /// The API's public address, without a trailing slash.
    pub public_url: String,
    /// The access log's format, or off.
    pub access_log: AccessLog,
    /// Whose `X-Forwarded-For` is believed.
    pub trusted_proxies: TrustedProxies,
}

/// Validated `[gateway.redis]`.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    /// Seed URLs.
    pub urls: Vec<String>,
    /// Time a limit decision may take in Redis.
    pub timeout: Duration,
    /// What to do without Redis.
    pub fallback: Fallback,
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
                urls: crate::redis_conn::parse_urls(text)
                    .map_err(|e| format!("gateway.redis.url: {e}"))?,
                timeout: Duration::from_millis(config.redis.timeout_ms.get()),
                fallback: config.redis.fallback,
            }),
        };
        let tls = match (&config.tls.listen, &config.tls.cert, &config.tls.key) {
            (None, None, None) => None,
            (Some(listen), Some(cert), Some(key)) => Some((
                *listen,
                TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                },
            )),
            _ => {
                return Err(
                    "gateway.tls: give listen, cert and key together (--tls-listen, --tls-cert, --tls-key)"
                        .to_owned(),
                );
            }
        };
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
        let mut routes = Vec::with_capacity(config.routes.len());
        for (i, route) in config.routes.iter().enumerate() {
            routes.push(
                route_settings(config, route, backend, &public_url, cors.as_ref())
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

fn route_settings(
    config: &GatewayConfig,
    route: &RouteConfig,
    backend: SocketAddr,
    public_url: &str,
    cors: Option<&Arc<CorsPolicy>>,
) -> Result<Route, String> {
    let prefix = &route.prefix;
    let normal = normalize_path(prefix).map_err(|e| format!(".prefix: {}", e.message()))?;
    if normal != prefix.as_str() || !prefix.starts_with("/v1/") || prefix.ends_with('/') {
        return Err(format!(
            ".prefix: `{prefix}` must be a plain path under /v1/ without a trailing slash"
        ));
    }
    let address = |field: &str, text: &str| {
        if text == BACKEND_UPSTREAM {
            Ok(backend)
        } else {
            text.parse::<SocketAddr>().map_err(|_| {
                format!("{field}: `{text}` is neither `backend` nor an address like 127.0.0.1:9000")
            })
        }
    };
    let upstream = match (&route.upstream, route.upstreams.as_slice()) {
        (Some(one), []) => Upstream::One(address(".upstream", one)?),
        (None, [_, ..]) => {
            let mut instances = Vec::with_capacity(route.upstreams.len());
            for (k, text) in route.upstreams.iter().enumerate() {
                instances.push(address(&format!(".upstreams[{k}]"), text)?);
            }
            let mut pool = LoadBalancer::<RoundRobin>::try_from_iter(instances)
                .map_err(|e| format!(".upstreams: {e}"))?;
            let mut check = TcpHealthCheck::new();
            check.peer_template.options.connection_timeout = Some(HEALTH_CHECK_TIMEOUT);
            pool.set_health_check(check);
            Upstream::Pool(Arc::new(pool))
        }
        _ => {
            return Err(
                ".upstream: give either `upstream` (one address) or `upstreams` (a pool), not both or neither"
                    .to_owned(),
            );
        }
    };
    let timeout = route.timeout_ms.unwrap_or(config.upstream_timeout_ms);
    let mut deprecations = Vec::with_capacity(route.deprecations.len());
    for (j, d) in route.deprecations.iter().enumerate() {
        let at = |what: &str, value: &str| {
            humantime::parse_rfc3339(value)
                .map(|t| t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()))
                .map_err(|_| format!(".deprecations[{j}].{what}: `{value}` is not an RFC 3339 UTC time like 2030-12-05T00:00:00Z"))
        };
        let pattern_ok =
            d.path == route.prefix || d.path.starts_with(&format!("{}/", route.prefix));
        if !pattern_ok {
            return Err(format!(
                ".deprecations[{j}].path: `{}` is not under the route's prefix `{prefix}`",
                d.path
            ));
        }
        if http::Method::from_bytes(d.method.as_bytes()).is_err() {
            return Err(format!(
                ".deprecations[{j}].method: `{}` is not an HTTP method",
                d.method
            ));
        }
        let deprecation = Deprecation::new(
            &d.method,
            &d.path,
            at("deprecated_at", &d.deprecated_at)?,
            at("sunset", &d.sunset)?,
            d.successor.as_deref(),
            d.documentation
                .as_deref()
                .map(|doc| {
                    if doc.starts_with('/') {
                        format!("{public_url}{doc}")
                    } else {
                        doc.to_owned()
                    }
                })
                .as_deref(),
            d.after_sunset,
        )
        .map_err(|e| format!(".deprecations[{j}]: {e}"))?;
        deprecations.push(Arc::new(deprecation));
    }
    Ok(Route {
        prefix: prefix.clone(),
        upstream,
        timeout: Duration::from_millis(timeout.get()),
        deprecations,
        tls: upstream_tls(route)?,
        cors: match &route.cors {
            Some(own) => cors_policy(own).map_err(|e| format!(".cors{e}"))?,
            None => cors.cloned(),
        },
    })
}

/// The route's `tls`, `sni` and `ca`, checked: TLS needs a name to verify, and a CA file must
/// hold certificates.
fn upstream_tls(route: &RouteConfig) -> Result<Option<UpstreamTls>, String> {
    if !route.tls {
        if route.sni.is_some() || route.ca.is_some() {
            return Err(".tls: `sni` and `ca` apply only with `tls = true`".to_owned());
        }
        return Ok(None);
    }
    let sni = route.sni.clone().ok_or_else(|| {
        ".sni: with `tls = true`, give the name on the upstream's certificate".to_owned()
    })?;
    let ca = match &route.ca {
        None => None,
        Some(path) => Some(Arc::from(
            crate::tls::load_ca(path).map_err(|e| format!(".ca: {e}"))?,
        )),
    };
    Ok(Some(UpstreamTls { sni, ca }))
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
        let err = settings("[bans]\nbase_seconds = 0\n").unwrap_err();
        assert!(
            err.contains("base_seconds") || err.contains("zero"),
            "{err}"
        );
    }
}
