//! The `[gateway]` section of the configuration file as written, with its defaults: the first of
//! the two layers ([`crate::settings`] is the second).
//!
//! Types, ranges and unknown keys are checked by serde while parsing, so the TOML error carries
//! the line.

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};
use std::time::Duration;

use serde::Deserialize;

use crate::access_log::AccessLog;
use crate::bans::BanPolicy;
use crate::deprecation::AfterSunset;
use crate::headers::HeaderCase;
use crate::plans::Plans;
use crate::store::Fallback;
use crate::store::redis::DEFAULT_TIMEOUT_MS;
use crate::tls::MinVersion;

/// Default public listener.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default admin listener (`/metrics`, `/healthz`, `/readyz`).
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9090";
/// Default request body limit: 1 MiB.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 1024 * 1024;
/// Default limit on a request's target, header names and values together: 16 KiB.
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
/// Default time between a pool's health checks.
pub const DEFAULT_HEALTH_CHECK_INTERVAL_MS: u64 = 1000;
/// The shortest time between a pool's health checks.
pub const MIN_HEALTH_CHECK_INTERVAL_MS: u64 = 100;
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
    /// `keepalive_timeout`); HTTP/2 connections and the admin port's too.
    pub keepalive_timeout_seconds: NonZeroU64,
    /// An HTTP/1.1 request head (plain or TLS, or to the admin port) not complete this long after
    /// its first byte closes the connection (nginx's `client_header_timeout`), so slow clients
    /// cannot hold sessions.
    pub header_timeout_seconds: NonZeroU64,
    /// Request bodies over this many bytes get 413 without reaching an upstream.
    pub max_body_bytes: u64,
    /// Requests whose target, header names and values together exceed this many bytes get 400
    /// `invalid_request`.
    pub max_header_bytes: usize,
    /// Default time an upstream may take to answer before the client gets 504.
    pub upstream_timeout_ms: NonZeroU64,
    /// Time to establish an upstream connection before the client gets 502.
    pub connect_timeout_ms: NonZeroU64,
    /// Time between health checks of a pool's instances (a TCP connect to each).
    pub health_check_interval_ms: NonZeroU64,
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
    /// How header names are written on HTTP/1.1: `preserve` or `lower`.
    pub header_case: HeaderCase,
    /// Load balancers (CIDRs) whose `X-Forwarded-For` and `X-Forwarded-Proto` are believed;
    /// empty: none.
    pub trusted_proxies: Vec<String>,
    /// The address clients use for this API, e.g. `https://api.example.com`. When set, the links
    /// the gateway writes (a deprecation's documentation) are absolute on it; unset, they are
    /// relative, so they resolve against whatever address and scheme the client used. The
    /// first-run message shows it (unset: `http://<listen>`).
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

/// `[gateway.tls]`: `listen`, `cert` and `key` all three, or none.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// Where HTTPS (HTTP/2 and HTTP/1.1 by ALPN) is served (`--tls-listen`).
    pub listen: Option<SocketAddr>,
    /// PEM certificate chain, leaf first (`--tls-cert`).
    pub cert: Option<std::path::PathBuf>,
    /// PEM private key of the certificate (`--tls-key`).
    pub key: Option<std::path::PathBuf>,
    /// Files of 80 random bytes each, the same on every gateway of a fleet, so that any of them
    /// resumes a session another gave out, and so does a restarted one: the first makes new
    /// session tickets, all of them open tickets. Empty: keys of each process's own. Used by the
    /// TLS listener however it is given (here or on the command line).
    pub ticket_keys: Vec<std::path::PathBuf>,
    /// False: no session tickets (nginx's `ssl_session_tickets off`), so no ticket key ever
    /// holds a session's secret; a returning client resumes only from this process's cache of
    /// the last 256 sessions.
    pub session_tickets: bool,
    /// The oldest TLS version served: `"1.2"` (the default: TLS 1.2 and 1.3) or `"1.3"`. Read at
    /// start; a `SIGHUP` leaves it as it was.
    pub min_version: MinVersion,
}

impl Default for TlsConfig {
    fn default() -> TlsConfig {
        TlsConfig {
            listen: None,
            cert: None,
            key: None,
            ticket_keys: Vec::new(),
            session_tickets: true,
            min_version: MinVersion::default(),
        }
    }
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
    /// With `rediss://` URLs: a PEM file of CA certificates to verify Redis with, instead of the
    /// system's roots.
    pub ca: Option<std::path::PathBuf>,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            ca: None,
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
            health_check_interval_ms: NonZeroU64::new(DEFAULT_HEALTH_CHECK_INTERVAL_MS)
                .expect("non-zero"),
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
            header_case: HeaderCase::Preserve,
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
    /// health-checked every `health_check_interval_ms`; a connection that cannot be made
    /// (refused, timed out, unreachable) is retried once on another instance, and its instance
    /// gets no traffic until a health check passes again.
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
    /// `/v1/docs#/pets/getpet` is made absolute with `gateway.public_url` when that is set, and
    /// is otherwise sent as it is (relative to the request's own URL).
    pub documentation: Option<String>,
    /// `gone` (answer 410 after the sunset, the default) or `forward`.
    #[serde(default = "default_after_sunset")]
    pub after_sunset: AfterSunset,
}

fn default_after_sunset() -> AfterSunset {
    AfterSunset::Gone
}
