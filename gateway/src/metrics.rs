//! Prometheus metrics of the gateway, served on the admin listener's `/metrics`.

use once_cell::sync::Lazy;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The registry the admin listener renders.
static REGISTRY: Lazy<Registry> = Lazy::new(Registry::new);

fn register<T: prometheus::core::Collector + Clone + 'static>(metric: T) -> T {
    REGISTRY
        .register(Box::new(metric.clone()))
        .expect("metric names are unique");
    metric
}

/// Responses by route (its prefix, `none`, or the gateway's own page), method, status and
/// outcome (`proxied`, `answered`, or the contract's error code). Every label value is bounded:
/// routes and plans come from the configuration, never from paths or keys.
pub static RESPONSES: Lazy<IntCounterVec> = Lazy::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "gateway_responses_total",
                "Responses of the public listener by route, method, status and outcome",
            ),
            &["route", "method", "status", "outcome"],
        )
        .expect("valid metric"),
    )
});

/// Requests refused by a key's limits, by plan and reason (`rate_limited`, `quota_exceeded`,
/// `key_banned`, `unavailable`).
pub static REFUSALS: Lazy<IntCounterVec> = Lazy::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "gateway_refusals_total",
                "Requests refused by a key's limits, by plan and reason",
            ),
            &["plan", "reason"],
        )
        .expect("valid metric"),
    )
});

/// Bans imposed, by plan.
pub static BANS: Lazy<IntCounterVec> = Lazy::new(|| {
    register(
        IntCounterVec::new(
            Opts::new("gateway_bans_total", "Key bans imposed, by plan"),
            &["plan"],
        )
        .expect("valid metric"),
    )
});

/// Failed authentications, by reason (`missing`, `malformed`, `unknown_key`, `expired`).
pub static AUTH_FAILURES: Lazy<IntCounterVec> = Lazy::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "gateway_auth_failures_total",
                "Requests without a valid key, by reason",
            ),
            &["reason"],
        )
        .expect("valid metric"),
    )
});

/// Time from choosing an upstream to its response header, by route.
pub static UPSTREAM_DURATION: Lazy<HistogramVec> = Lazy::new(|| {
    register(
        HistogramVec::new(
            HistogramOpts::new(
                "gateway_upstream_duration_seconds",
                "Time from choosing the upstream to its response header, by route",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
            ]),
            &["route"],
        )
        .expect("valid metric"),
    )
});

/// A method as a label: the common ones by name, anything else as `other`.
pub fn method_label(method: &http::Method) -> &'static str {
    match *method {
        http::Method::GET => "GET",
        http::Method::POST => "POST",
        http::Method::PUT => "PUT",
        http::Method::PATCH => "PATCH",
        http::Method::DELETE => "DELETE",
        http::Method::HEAD => "HEAD",
        http::Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// Time from request to the end of the response.
pub static DURATION: Lazy<Histogram> = Lazy::new(|| {
    register(
        Histogram::with_opts(
            HistogramOpts::new(
                "gateway_request_duration_seconds",
                "Time to answer a request",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
            ]),
        )
        .expect("valid metric"),
    )
});

/// Usable keys in the key store.
pub static ACTIVE_KEYS: Lazy<IntGauge> = Lazy::new(|| {
    register(IntGauge::new("gateway_active_keys", "Usable API keys loaded").expect("valid metric"))
});

/// Keys with state in the embedded limit store's table, as of its last pass.
pub static LIMITER_KEYS: Lazy<IntGauge> = Lazy::new(|| {
    register(
        IntGauge::new(
            "gateway_limiter_keys",
            "Keys with limit state in this gateway's memory (embedded store), as of its last pass",
        )
        .expect("valid metric"),
    )
});

/// The bytes of the embedded limit store's table, as of its last pass: its slots, used or not,
/// whichever allocator serves them.
pub static LIMITER_BYTES: Lazy<IntGauge> = Lazy::new(|| {
    register(
        IntGauge::new(
            "gateway_limiter_bytes",
            "Bytes of the embedded limit store's table of key states, as of its last pass",
        )
        .expect("valid metric"),
    )
});

/// Key sets loaded from the store since start (the first load included).
pub static KEY_LOADS: Lazy<IntCounter> = Lazy::new(|| {
    register(
        IntCounter::new(
            "gateway_key_loads_total",
            "Key sets loaded from the key store",
        )
        .expect("valid metric"),
    )
});

/// Key records that Redis had lost and this gateway wrote back.
pub static KEY_RECORDS_RESTORED: Lazy<IntCounter> = Lazy::new(|| {
    register(
        IntCounter::new(
            "gateway_key_records_restored_total",
            "Key records Redis had lost (restarted empty, flushed) that this gateway wrote back",
        )
        .expect("valid metric"),
    )
});

/// Key store reloads that failed (the previous key set stays in use).
pub static KEY_RELOAD_FAILURES: Lazy<IntGauge> = Lazy::new(|| {
    register(
        IntGauge::new(
            "gateway_key_reload_failures",
            "Failed key store reloads since start",
        )
        .expect("valid metric"),
    )
});

/// 1 while limits are decided in Redis, 0 while a gateway configured with Redis decides alone.
pub static LIMIT_STORE_UP: Lazy<IntGauge> = Lazy::new(|| {
    register(
        IntGauge::new(
            "gateway_limit_store_up",
            "1 while the shared limit store (Redis) decides limits, else 0",
        )
        .expect("valid metric"),
    )
});

/// Gateways sharing Redis, as this one counted them at its last heartbeat.
pub static LIMIT_STORE_GATEWAYS: Lazy<IntGauge> = Lazy::new(|| {
    register(
        IntGauge::new(
            "gateway_limit_store_gateways",
            "Gateways sharing the limit store (Redis) at the last heartbeat, this one included; \
             fallback `local` divides each limit by it",
        )
        .expect("valid metric"),
    )
});

/// Requests whose limits were decided by the fallback because Redis could not decide.
pub static LIMIT_STORE_FALLBACKS: Lazy<IntCounter> = Lazy::new(|| {
    register(
        IntCounter::new(
            "gateway_limit_store_fallbacks_total",
            "Requests decided by gateway.redis.fallback because Redis was unreachable or slow",
        )
        .expect("valid metric"),
    )
});

/// Times Redis went from answering to not answering.
pub static LIMIT_STORE_OUTAGES: Lazy<IntCounter> = Lazy::new(|| {
    register(
        IntCounter::new(
            "gateway_limit_store_outages_total",
            "Times the shared limit store (Redis) stopped answering",
        )
        .expect("valid metric"),
    )
});

/// Reloads asked for by SIGHUP, by result (`ok`, `error`).
pub static RELOADS: Lazy<IntCounterVec> = Lazy::new(|| {
    register(
        IntCounterVec::new(
            Opts::new("gateway_reloads_total", "SIGHUP reloads by result"),
            &["result"],
        )
        .expect("valid metric"),
    )
});

/// Upstream attempts that failed and were tried again, by route, instance and pingora's error
/// type (`ConnectRefused`: an instance of a pool down; `ConnectionClosed`, `ReadError`: a reused
/// connection the upstream had closed).
pub static UPSTREAM_RETRIES: Lazy<IntCounterVec> = Lazy::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "gateway_upstream_retries_total",
                "Upstream attempts that failed and were tried again, by route, instance and error type",
            ),
            &["route", "instance", "error"],
        )
        .expect("valid metric"),
    )
});

/// Connections the gateway opened to upstream instances, by route and instance. A request that
/// reused an idle connection does not count: against `gateway_responses_total`, it shows how
/// well upstream connections are reused.
pub static UPSTREAM_CONNECTIONS: Lazy<IntCounterVec> = Lazy::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "gateway_upstream_connections_total",
                "Connections opened to upstream instances (not counting reused ones), by route and instance",
            ),
            &["route", "instance"],
        )
        .expect("valid metric"),
    )
});

/// Whether each upstream instance of a pool is in the rotation, by route and instance.
pub static UPSTREAM_HEALTHY: Lazy<IntGaugeVec> = Lazy::new(|| {
    register(
        IntGaugeVec::new(
            Opts::new(
                "gateway_upstream_healthy",
                "1 while an upstream instance of a pool gets traffic (its health checks pass and no connection to it has failed since the last that passed), else 0",
            ),
            &["route", "instance"],
        )
        .expect("valid metric"),
    )
});

/// Client connections closed by the gateway's timeouts, by phase: `idle` (no request within
/// `keepalive_timeout_seconds`), `header` (a request head not complete within
/// `header_timeout_seconds`).
pub static CLIENT_TIMEOUTS: Lazy<IntCounterVec> = Lazy::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "gateway_client_timeouts_total",
                "Client connections closed for silence between requests (idle), a slow request head (header) or a request body that stopped arriving (body)",
            ),
            &["phase"],
        )
        .expect("valid metric"),
    )
});

/// TLS handshakes completed on the HTTPS listener, by protocol version (`TLSv1.3`, `TLSv1.2`)
/// and session (`full`, or `resumed` from a ticket or rustls's cache): how often returning
/// clients resume, which is what session tickets are for.
pub static TLS_HANDSHAKES: Lazy<IntCounterVec> = Lazy::new(|| {
    register(
        IntCounterVec::new(
            Opts::new(
                "gateway_tls_handshakes_total",
                "TLS handshakes completed by clients, by version and session (full or resumed)",
            ),
            &["version", "session"],
        )
        .expect("valid metric"),
    )
});

/// HTTP/1.1 client connections (plain or TLS) open now.
pub static CLIENT_CONNECTIONS: Lazy<IntGauge> = Lazy::new(|| {
    register(
        IntGauge::new(
            "gateway_client_connections",
            "Client connections over HTTP/1.1 (plain or TLS) open now",
        )
        .expect("valid metric"),
    )
});

/// Counts one open connection in [`CLIENT_CONNECTIONS`] for as long as it lives.
pub struct OpenConnection(());

impl OpenConnection {
    /// Counts a connection that just opened, until the value is dropped.
    pub fn open() -> OpenConnection {
        CLIENT_CONNECTIONS.inc();
        OpenConnection(())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        CLIENT_CONNECTIONS.dec();
    }
}

/// The text exposition of every metric.
pub fn render() -> Vec<u8> {
    Lazy::force(&RESPONSES);
    Lazy::force(&DURATION);
    Lazy::force(&ACTIVE_KEYS);
    Lazy::force(&KEY_RELOAD_FAILURES);
    Lazy::force(&KEY_LOADS);
    Lazy::force(&KEY_RECORDS_RESTORED);
    Lazy::force(&LIMIT_STORE_FALLBACKS);
    Lazy::force(&LIMIT_STORE_OUTAGES);
    Lazy::force(&CLIENT_CONNECTIONS);
    // LIMITER_KEYS and LIMITER_BYTES are left to the embedded store, which sets them as it opens:
    // a gateway whose limits are in Redis has no such table, and shows neither.
    for result in ["ok", "error"] {
        RELOADS.with_label_values(&[result]);
    }
    for phase in ["idle", "header", "body"] {
        CLIENT_TIMEOUTS.with_label_values(&[phase]);
    }
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&REGISTRY.gather(), &mut out)
        .expect("encoding to a Vec cannot fail");
    out
}

/// Status as a label without allocating for the common ones.
pub fn status_label(status: u16) -> &'static str {
    match status {
        200 => "200",
        201 => "201",
        400 => "400",
        401 => "401",
        404 => "404",
        405 => "405",
        410 => "410",
        413 => "413",
        415 => "415",
        429 => "429",
        500 => "500",
        502 => "502",
        503 => "503",
        504 => "504",
        0 => "none",
        _ => "other",
    }
}
