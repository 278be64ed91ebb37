//! The proxy: orchestrates pingora's phases; every decision is made by the modules it calls.
//!
//! ```text
//! request_filter          path normalized (400) → route looked up → key checked (401 / 429
//!                         too_many_auth_failures) → limits (429) → no route (404) →
//!                         past sunset (410) → declared body too large (413)
//! request_body_filter     streamed body too large (413)
//! upstream_peer           the route's upstream, with its timeouts
//! upstream_request_filter drop Authorization; add X-Request-Id, X-Forwarded-For,
//!                         X-Api-Key-Id, X-Api-Plan (pingora itself drops hop-by-hop headers
//!                         and those the client's Connection header names)
//! response_filter         rate-limit, request-id and deprecation headers
//! fail_to_proxy           upstream unreachable → 502, too slow → 504 (JSON, same headers)
//! logging                 metrics and the access log (key id only, never the key)
//! ```

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use animal_store_contract::{ErrorCode, RATE_LIMIT_PATH};
use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::Bytes;
use http::HeaderValue;
use once_cell::sync::Lazy;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::{Error, ErrorType, Result};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};

use crate::access_log::{self, AccessLog};
use crate::auth::{Budget, FailureBudget, authorize};
use crate::client::TrustedProxies;
use crate::config::{MAX_HEADERS, Settings};
use crate::cors::{self, CorsPolicy};
use crate::deprecation::Deprecation;
use crate::errors::{GatewayError, respond};
use crate::headers::{self, RateHeaders};
use crate::keyring::Keyring;
use crate::keys::ActiveKey;
use crate::limits::{Verdict, ceil_secs};
use crate::metrics;
use crate::pages;
use crate::routes::{Route, Upstream, normalize_path};
use crate::store::LimitStore;
use crate::unix_ms;

/// Pooled upstream connections are dropped after this long idle, well before a typical
/// upstream's own keep-alive timeout, so the gateway never writes into a connection the
/// upstream has just closed.
const UPSTREAM_IDLE: Duration = Duration::from_secs(30);

/// After answering before the request body was read, the gateway reads and discards the rest of
/// it for up to this long, as nginx's `lingering_close` does: a client still sending would
/// otherwise get a connection reset instead of the answer.
const LINGER_TIME: Duration = Duration::from_secs(5);
/// ... and at most this many bytes; past it the connection is closed.
const LINGER_BYTES: usize = 64 * 1024 * 1024;

/// Reads and discards what is left of the request body, within [`LINGER_TIME`] and
/// [`LINGER_BYTES`]; a body drained to its end leaves the connection reusable.
async fn linger(session: &mut Session) {
    let deadline = tokio::time::Instant::now() + LINGER_TIME;
    let mut drained = 0;
    while !session.is_body_done() {
        match tokio::time::timeout_at(deadline, session.read_request_body()).await {
            Ok(Ok(Some(chunk))) if drained + chunk.len() <= LINGER_BYTES => drained += chunk.len(),
            Ok(Ok(None)) => return,
            _ => {
                session.set_keepalive(None);
                return;
            }
        }
    }
}

/// Per-request state, from the first phase to `logging`.
pub struct Ctx {
    /// The configuration in force when the request arrived, used to its end: a reload never
    /// shows one request half of two configurations.
    pub settings: Arc<Settings>,
    /// The client's address (see [`crate::client`]); unspecified until the request is read.
    pub client: IpAddr,
    /// Returned to the client and forwarded upstream.
    pub request_id: String,
    /// Unix milliseconds when the request was decided on.
    pub now_ms: u64,
    /// What the response says about the caller's limits.
    pub rate: Option<RateHeaders>,
    /// Set on a deprecated operation.
    pub deprecation: Option<Arc<Deprecation>>,
    /// Status of the gateway's own answer, for logging.
    pub status: u16,
    /// Code of the gateway's own error answer, for metrics.
    pub error_code: Option<ErrorCode>,
    /// The request's `Origin`, when CORS allows it: responses then carry the CORS headers.
    pub cors: Option<HeaderValue>,
    /// The upstream instance the request went to (the last one tried).
    pub instance: Option<SocketAddr>,
    /// An instance that refused the connection; the one retry goes elsewhere.
    refused_by: Option<SocketAddr>,
    /// The gateway's own answer that served the request (a page, a preflight, `rate_limit`),
    /// as it appears in metrics and the access log.
    pub answered: Option<&'static str>,
    upstream_started: Option<Instant>,
    key: Option<Arc<ActiveKey>>,
    route: Option<Arc<Route>>,
    body_bytes: u64,
    started: Instant,
}

/// What `admit` decided for a request that is not refused.
enum Admission {
    /// Forward it upstream.
    Forward,
    /// A CORS preflight: the gateway answers it.
    Preflight(Arc<CorsPolicy>),
    /// `GET /v1/rate_limit`: the gateway answers where this key stands.
    RateLimit(Arc<ActiveKey>),
}

/// The gateway's state shared by all requests.
pub struct Gateway {
    live: Arc<ArcSwap<Settings>>,
    keys: Arc<Keyring>,
    limits: Arc<LimitStore>,
    failures: FailureBudget,
    address_policy: HeaderValue,
}

impl Gateway {
    /// A gateway with the configuration in `live` (swapped by a reload), reading keys from
    /// `keys` and counting in `limits`.
    pub fn new(
        live: Arc<ArcSwap<Settings>>,
        keys: Arc<Keyring>,
        limits: Arc<LimitStore>,
    ) -> Gateway {
        let settings = live.load_full();
        Gateway {
            limits,
            failures: FailureBudget::new(settings.auth_failures_per_minute),
            address_policy: headers::address_policy(settings.auth_failures_per_minute),
            live,
            keys,
        }
    }

    /// Every decision before forwarding, in the order of the phase chart; `Err` is the answer to
    /// send instead.
    async fn admit(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
    ) -> std::result::Result<Admission, GatewayError> {
        ctx.now_ms = unix_ms();
        let settings = ctx.settings.clone();
        let ip = ctx.client;
        let unroutable = self.normalize(session).map_err(str::to_owned);
        let request = session.req_header();
        if let Err(why) = unroutable.and_then(|()| check_headers(request, &settings)) {
            ctx.rate = Some(self.address_rate(self.failures.peek(ip, ctx.now_ms)));
            return Err(GatewayError::new(ErrorCode::InvalidRequest, why));
        }
        let path = request.uri.path();
        let route = settings.routes.find(path).cloned();
        ctx.route.clone_from(&route);
        ctx.deprecation = route
            .as_ref()
            .and_then(|r| r.deprecation(request.method.as_str(), path))
            .cloned();
        let policy = route
            .as_ref()
            .map_or(settings.cors.as_ref(), |r| r.cors.as_ref());
        ctx.cors = policy.and_then(|p| p.allowed_origin(request));
        if let Some(policy) = policy.filter(|_| cors::is_preflight(request)) {
            // A preflight never carries a key: answered without one, and counted nowhere.
            ctx.rate = Some(self.address_rate(self.failures.peek(ip, ctx.now_ms)));
            return Ok(Admission::Preflight(policy.clone()));
        }

        let key = self.authenticate(request, ip, ctx)?;
        if path == RATE_LIMIT_PATH {
            ctx.key = Some(key.clone());
            if request.method != http::Method::GET {
                return Err(GatewayError::new(
                    ErrorCode::MethodNotAllowed,
                    "the rate_limit resource is read with GET",
                )
                .allow("GET"));
            }
            return Ok(Admission::RateLimit(key));
        }
        let limited = self.apply_limits(&key, ctx).await;
        ctx.key = Some(key); // also for refusals: the access log names the key
        limited?;

        let route = route
            .ok_or_else(|| GatewayError::new(ErrorCode::NotFound, "no route for this path"))?;
        if let Some(d) = ctx
            .deprecation
            .as_ref()
            .filter(|d| d.is_gone(ctx.now_ms / 1000))
        {
            let sunset = d.sunset_header.to_str().unwrap_or("its sunset date");
            return Err(GatewayError::new(
                ErrorCode::Gone,
                format!(
                    "this operation was removed on {sunset}; see the Link header for its successor"
                ),
            ));
        }
        ctx.route = Some(route);
        let declared = session
            .req_header()
            .headers
            .get(http::header::CONTENT_LENGTH);
        let declared = declared
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|len| len > settings.max_body_bytes) {
            return Err(too_large(&settings));
        }
        Ok(Admission::Forward)
    }

    /// Answers `GET /v1/rate_limit` for `key`, counting nothing.
    async fn rate_limit(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        key: &Arc<ActiveKey>,
    ) -> Result<()> {
        let Ok(standing) = self.limits.peek(key.counters, key.limits, ctx.now_ms).await else {
            let unavailable = GatewayError::new(
                ErrorCode::Unavailable,
                "the shared limit store cannot be reached; retry shortly",
            )
            .retry_after(Some(1));
            return respond(session, ctx, unavailable).await;
        };
        ctx.rate = Some(RateHeaders::for_quota(
            &standing.headline(key.limits),
            &key.policy,
        ));
        let (minute, day) = (standing.minute, standing.day);
        pages::rate_limit(session, ctx, key, minute, day, standing.banned_until_ms).await
    }

    /// The key the request carries; a failure spends the client address's budget.
    fn authenticate(
        &self,
        request: &RequestHeader,
        ip: IpAddr,
        ctx: &mut Ctx,
    ) -> std::result::Result<Arc<ActiveKey>, GatewayError> {
        let authorization = request
            .headers
            .get(http::header::AUTHORIZATION)
            .map(HeaderValue::as_bytes);
        let failure = match authorize(authorization, &self.keys.current(), ctx.now_ms) {
            Ok(key) => {
                key.touch(ctx.now_ms);
                return Ok(key);
            }
            Err(failure) => failure,
        };
        metrics::AUTH_FAILURES
            .with_label_values(&[failure.label()])
            .inc();
        let budget = self.failures.fail(ip, ctx.now_ms);
        ctx.rate = Some(self.address_rate(budget));
        if !budget.exhausted {
            return Err(GatewayError::new(
                ErrorCode::Unauthorized,
                failure.message(),
            ));
        }
        let wait = ceil_secs(budget.reset_ms.saturating_sub(ctx.now_ms)).max(1);
        Err(GatewayError::new(
            ErrorCode::TooManyAuthFailures,
            format!("too many requests with missing or invalid keys from this address; retry in {wait} s"),
        )
        .retry_after(Some(wait)))
    }

    /// Counts the request against the key's limits, or says which one refuses it.
    async fn apply_limits(
        &self,
        key: &ActiveKey,
        ctx: &mut Ctx,
    ) -> std::result::Result<(), GatewayError> {
        let bans = ctx.settings.bans;
        let plan = key.plan.to_str().unwrap_or("?");
        let Ok(decision) = self
            .limits
            .check(key.counters, key.limits, &bans, ctx.now_ms)
            .await
        else {
            metrics::REFUSALS
                .with_label_values(&[plan, "unavailable"])
                .inc();
            return Err(GatewayError::new(
                ErrorCode::Unavailable,
                "the shared limit store cannot be reached; retry shortly",
            )
            .retry_after(Some(1)));
        };
        ctx.rate = Some(RateHeaders::for_key(&decision, &key.policy));
        if decision.ban_imposed {
            metrics::BANS.with_label_values(&[plan]).inc();
        }
        let retry = decision.retry_after_secs(ctx.now_ms);
        let wait = retry.unwrap_or(1);
        let (code, message) = match decision.verdict {
            Verdict::Admitted => return Ok(()),
            Verdict::RateLimited => (
                ErrorCode::RateLimited,
                format!(
                    "this key's limit of {} requests per minute is spent; retry in {wait} s",
                    key.limits.per_minute
                ),
            ),
            Verdict::QuotaExceeded => (
                ErrorCode::QuotaExceeded,
                format!(
                    "this key's quota of {} requests per day is spent; it resets at 00:00 UTC, in {wait} s",
                    key.limits.per_day
                ),
            ),
            Verdict::Banned => (
                ErrorCode::KeyBanned,
                format!(
                    "this key is banned for repeated requests over its limit; retry in {wait} s"
                ),
            ),
        };
        metrics::REFUSALS
            .with_label_values(&[plan, code.as_str()])
            .inc();
        Err(GatewayError::new(code, message).retry_after(retry))
    }

    /// The rate-limit headers of a request without a valid key: its address's failure budget.
    fn address_rate(&self, budget: Budget) -> RateHeaders {
        RateHeaders::for_address(&budget, &self.address_policy)
    }

    /// Rewrites the request path to its one normalized form, or says why it has none.
    fn normalize(&self, session: &mut Session) -> std::result::Result<(), &'static str> {
        let uri = &session.req_header().uri;
        let rewritten = match normalize_path(uri.path()).map_err(|e| e.message())? {
            std::borrow::Cow::Borrowed(_) => return Ok(()),
            std::borrow::Cow::Owned(path) => match uri.query() {
                Some(query) => format!("{path}?{query}"),
                None => path,
            },
        };
        let uri = http::Uri::try_from(rewritten).map_err(|_| "the request target is malformed")?;
        session.req_header_mut().set_uri(uri);
        Ok(())
    }
}

/// Refuses requests with more headers, or more header bytes, than are forwarded.
fn check_headers(request: &RequestHeader, settings: &Settings) -> std::result::Result<(), String> {
    if request.headers.len() > MAX_HEADERS {
        return Err(format!("a request may carry at most {MAX_HEADERS} headers"));
    }
    let bytes: usize = request
        .headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if bytes > settings.max_header_bytes {
        return Err(format!(
            "the request headers are larger than {} bytes",
            settings.max_header_bytes
        ));
    }
    Ok(())
}

fn too_large(settings: &Settings) -> GatewayError {
    GatewayError::new(
        ErrorCode::PayloadTooLarge,
        format!(
            "the request body is larger than {} bytes",
            settings.max_body_bytes
        ),
    )
}

static REQUEST_IDS: Lazy<(u32, AtomicU64)> = Lazy::new(|| {
    let mut seed = [0u8; 4];
    let _ = getrandom::fill(&mut seed);
    (u32::from_be_bytes(seed), AtomicU64::new(0))
});

/// A request id unique within this process and, with its random prefix, across restarts.
fn next_request_id() -> String {
    let (prefix, counter) = &*REQUEST_IDS;
    format!(
        "{prefix:08x}{:016x}",
        counter.fetch_add(1, Ordering::Relaxed)
    )
}

/// The TCP peer's address.
fn peer_ip(session: &Session) -> IpAddr {
    session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.ip())
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx {
            settings: self.live.load_full(),
            client: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            request_id: next_request_id(),
            now_ms: 0,
            rate: None,
            deprecation: None,
            status: 0,
            error_code: None,
            cors: None,
            answered: None,
            instance: None,
            refused_by: None,
            upstream_started: None,
            key: None,
            route: None,
            body_bytes: 0,
            started: Instant::now(),
        }
    }

    fn init_downstream_modules(&self, _modules: &mut pingora::modules::http::HttpModules) {
        // No compression module: the gateway never compresses, so it need not run per request.
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        // HTTP/1.1 keep-alive is unbounded in pingora: close idle clients as nginx does. (Off
        // stays off: `Connection: close` and HTTP/1.0 without keep-alive.)
        if session.get_keepalive().is_some() {
            session.set_keepalive(Some(ctx.settings.keepalive_timeout.as_secs()));
        }
        let forwarded = session.req_header().headers.get_all("X-Forwarded-For");
        ctx.client = ctx.settings.trusted_proxies.client(
            peer_ip(session),
            forwarded.iter().map(HeaderValue::as_bytes),
        );
        if let Some(page) = pages::public_page(session.req_header()) {
            // The API's pages are public: no key, nothing counted against one.
            ctx.now_ms = unix_ms();
            ctx.rate = Some(self.address_rate(self.failures.peek(ctx.client, ctx.now_ms)));
            let policy = ctx.settings.cors.clone();
            ctx.cors = policy.and_then(|p| p.allowed_origin(session.req_header()));
            ctx.answered = Some("pages");
            pages::serve(session, ctx, page).await?;
            return Ok(true);
        }
        match self.admit(session, ctx).await {
            Ok(Admission::Forward) => Ok(false),
            Ok(Admission::Preflight(policy)) => {
                ctx.answered = Some("preflight");
                pages::preflight(session, ctx, &policy).await?;
                Ok(true)
            }
            Ok(Admission::RateLimit(key)) => {
                ctx.answered = Some("rate_limit");
                self.rate_limit(session, ctx, &key).await?;
                Ok(true)
            }
            Err(error) => {
                respond(session, ctx, error).await?;
                linger(session).await;
                Ok(true)
            }
        }
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut Ctx,
    ) -> Result<()> {
        ctx.body_bytes += body.as_ref().map_or(0, |b| b.len() as u64);
        if ctx.body_bytes > ctx.settings.max_body_bytes {
            return Error::e_explain(ErrorType::HTTPStatus(413), "request body over the limit");
        }
        Ok(())
    }

    async fn upstream_peer(&self, _session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        let Some(route) = &ctx.route else {
            return Error::e_explain(ErrorType::InternalError, "no route chosen");
        };
        ctx.upstream_started = Some(Instant::now());
        let Some(instance) = route.upstream.pick(ctx.refused_by) else {
            return Error::e_explain(ErrorType::ConnectNoRoute, "no instance of the upstream");
        };
        ctx.instance = Some(instance);
        let mut peer = match &route.tls {
            None => HttpPeer::new(instance, false, String::new()),
            Some(tls) => {
                let mut peer = HttpPeer::new(instance, true, tls.sni.clone());
                peer.options.ca = tls.ca.clone();
                peer
            }
        };
        peer.options.connection_timeout = Some(ctx.settings.connect_timeout);
        peer.options.read_timeout = Some(route.timeout);
        peer.options.write_timeout = Some(route.timeout);
        peer.options.idle_timeout = Some(UPSTREAM_IDLE);
        Ok(Box::new(peer))
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut Ctx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        // A refused connection sent nothing upstream, so another instance of a pool may take
        // the request, whatever its method; once.
        let pool = ctx
            .route
            .as_ref()
            .is_some_and(|r| matches!(r.upstream, Upstream::Pool(_)));
        if pool && ctx.refused_by.is_none() && e.etype() == &ErrorType::ConnectRefused {
            ctx.refused_by = ctx.instance;
            e.set_retry(true);
        }
        e
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        upstream.remove_header(&http::header::AUTHORIZATION);
        upstream.insert_header("X-Request-Id", &ctx.request_id)?;
        let received = upstream
            .headers
            .get("X-Forwarded-For")
            .and_then(|v| v.to_str().ok());
        let forwarded = TrustedProxies::forward(ctx.client, received);
        upstream.insert_header("X-Forwarded-For", forwarded)?;
        if let Some(key) = &ctx.key {
            upstream.insert_header("X-Api-Key-Id", key.id_header.clone())?;
            upstream.insert_header("X-Api-Plan", key.plan.clone())?;
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if let (Some(started), Some(route)) = (ctx.upstream_started, &ctx.route) {
            metrics::UPSTREAM_DURATION
                .with_label_values(&[route.prefix.as_str()])
                .observe(started.elapsed().as_secs_f64());
        }
        headers::decorate(response, ctx)
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy {
        let answer = GatewayError::from_proxy_error(e);
        if let Some(error) = &answer {
            if error.code == ErrorCode::InternalError {
                log::error!("request {}: {e}", ctx.request_id);
            } else {
                log::warn!("request {}: {}: {e}", ctx.request_id, error.code.as_str());
            }
        }
        let mut code = 0;
        if let Some(error) = answer
            && session.response_written().is_none()
        {
            code = error.code.status();
            // pingora will not reuse this connection; say so, or the client sends its next
            // request into a closed socket.
            session.set_keepalive(None);
            match respond(session, ctx, error).await {
                Ok(()) => linger(session).await,
                Err(write_error) => log::debug!(
                    "request {}: could not send the error: {write_error}",
                    ctx.request_id
                ),
            }
        }
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    async fn logging(&self, session: &mut Session, _e: Option<&Error>, ctx: &mut Ctx) {
        let status = session
            .response_written()
            .map_or(ctx.status, |r| r.status.as_u16());
        let outcome = match (ctx.error_code, ctx.answered) {
            (Some(code), _) => code.as_str(),
            (None, Some(_)) => "answered",
            (None, None) => "proxied",
        };
        let route = ctx
            .answered
            .or_else(|| ctx.route.as_ref().map(|r| r.prefix.as_str()))
            .unwrap_or("none");
        let request = session.req_header();
        let method = metrics::method_label(&request.method);
        metrics::RESPONSES
            .with_label_values(&[route, method, metrics::status_label(status), outcome])
            .inc();
        let elapsed = ctx.started.elapsed();
        metrics::DURATION.observe(elapsed.as_secs_f64());
        let format = ctx.settings.access_log;
        if format != AccessLog::Off {
            let forwarded = ctx.upstream_started.is_some();
            access_log::write(
                format,
                &access_log::Entry {
                    time_ms: ctx.now_ms,
                    request_id: &ctx.request_id,
                    client: if ctx.client.is_unspecified() {
                        peer_ip(session)
                    } else {
                        ctx.client
                    },
                    key_id: ctx.key.as_ref().map(|k| k.id.to_string()),
                    plan: ctx.key.as_ref().and_then(|k| k.plan.to_str().ok()),
                    method: request.method.as_str(),
                    path: request.uri.path(),
                    route,
                    upstream: ctx.instance.filter(|_| forwarded).map(|i| i.to_string()),
                    status,
                    latency_ms: elapsed.as_secs_f64() * 1000.0,
                    decision: if outcome == "proxied" {
                        "admitted"
                    } else {
                        outcome
                    },
                },
            );
        }
    }
}
