//! The per-request context (pingora's `CTX`): what one request has been found to be, from the
//! first phase to `logging`. Phases fill it in; decisions read it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use animal_store_contract::ErrorCode;

use crate::cors::Cors;
use crate::deprecation::Deprecation;
use crate::key_set::ActiveKey;
use crate::rate_headers::RateHeaders;
use crate::request_id::RequestId;
use crate::routes::Route;
use crate::settings::Settings;

/// Per-request state, from the first phase to `logging`.
pub struct Ctx {
    /// The configuration in force when the request arrived, used to its end: a reload never
    /// shows one request half of two configurations.
    pub settings: Arc<Settings>,
    /// The client's address (see [`crate::client`]); unspecified until the request is read.
    pub client: IpAddr,
    /// Returned to the client and forwarded upstream.
    pub request_id: RequestId,
    /// Unix milliseconds when the request was decided on.
    pub now_ms: u64,
    /// What the response says about the caller's limits.
    pub rate: Option<RateHeaders>,
    /// Set on a deprecated operation.
    pub deprecation: Option<Arc<Deprecation>>,
    /// Status of the gateway's own answer, for logging; 0 when it gave none.
    pub status: u16,
    /// Code of the gateway's own error answer, for metrics.
    pub error_code: Option<ErrorCode>,
    /// What CORS makes of the request: the headers its responses carry.
    pub cors: Cors,
    /// The upstream instance the request went to (the last one tried).
    pub instance: Option<SocketAddr>,
    /// An instance the gateway could not connect to; the one retry goes elsewhere.
    pub(crate) unreachable: Option<SocketAddr>,
    /// The gateway's own answer that served the request (a page, a preflight, `rate_limit`),
    /// as it appears in metrics and the access log.
    pub answered: Option<&'static str>,
    /// When the gateway began to reach the upstream: the start of the upstream's latency.
    pub(crate) upstream_started: Option<Instant>,
    /// The request's body stopped arriving while the upstream waited for it.
    pub(crate) body_stalled: bool,
    /// The caller's key, once it is found valid.
    pub(crate) key: Option<Arc<ActiveKey>>,
    /// The route the request's path chose.
    pub(crate) route: Option<Arc<Route>>,
    /// The request body's bytes forwarded so far.
    pub(crate) body_bytes: u64,
    /// When the request's context was made: the start of the request's latency.
    pub(crate) started: Instant,
}

impl Ctx {
    /// A request's context under `settings`, before anything of the request is known.
    pub(crate) fn new(settings: Arc<Settings>) -> Ctx {
        Ctx {
            settings,
            client: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            request_id: RequestId::next(),
            now_ms: 0,
            rate: None,
            deprecation: None,
            status: 0,
            error_code: None,
            cors: Cors::Off,
            answered: None,
            instance: None,
            unreachable: None,
            upstream_started: None,
            body_stalled: false,
            key: None,
            route: None,
            body_bytes: 0,
            started: Instant::now(),
        }
    }

    /// The `route` and `instance` labels of the upstream metrics: the route's prefix (`none`
    /// before one is chosen) and the instance tried last (empty before one is).
    pub(crate) fn upstream_labels(&self) -> (&str, String) {
        let route = self.route.as_ref().map_or("none", |r| r.prefix.as_str());
        let instance = self.instance.map(|i| i.to_string()).unwrap_or_default();
        (route, instance)
    }
}
