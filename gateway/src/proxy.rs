//! The proxy: orchestrates pingora's phases; every decision is made by the modules it calls
//! ([`crate::admission`] for all of `request_filter`'s). Before the first phase, and between
//! requests of a connection, [`crate::connections`] holds the client connection and times it.
//!
//! ```text
//! new_ctx                 the configuration in force, for the whole request
//! request_filter          the request's head is in: the header timeout stops →
//!                         client address (trusted proxies) → public pages (docs, OpenAPI) →
//!                         request line valid as sent, body framing and Host unambiguous
//!                         (400, connection closed) →
//!                         path normalized, headers within limits (400), the client's `_`
//!                         spellings of the headers set upstream dropped →
//!                         route looked up → CORS preflight (204) →
//!                         key checked (401 / 429 too_many_auth_failures) → /v1/rate_limit →
//!                         limits (429, or 503 with fallback = deny) → no route (404) →
//!                         past sunset (410) → declared body too large (413)
//! request_body_filter     streamed body too large (413)
//! upstream_peer           the route's instance (a pool's next healthy one), with timeouts
//! connected_to_upstream   a new upstream connection (not a reused one) counted
//! fail_to_connect         a pool instance refused the connection → retried once elsewhere
//! error_while_proxy       a new connection closed unanswered → idempotent requests likewise;
//!                         a head that met a reset → any request (nothing was sent)
//! upstream_request_filter drop Authorization; add X-Request-Id, X-Forwarded-For (the
//!                         client, after a trusted proxy's chain; alone from anyone else),
//!                         X-Api-Key-Id, X-Api-Plan (the client's spellings of them with `_`
//!                         were dropped in request_filter; pingora itself drops hop-by-hop
//!                         headers and those the client's Connection header names)
//! response_filter         rate-limit, request-id, CORS and deprecation headers (not on an
//!                         interim `100 Continue`, which leaves the connection reusable)
//! fail_to_proxy           upstream unreachable → 502, too slow → 504 (JSON, same headers);
//!                         also in place of a response it broke off before any of it left
//! logging                 metrics and the access log (key id only, never the key)
//! ```

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use animal_store_contract::ErrorCode;
use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::protocols::Digest;
use pingora::protocols::http::v1::common::is_expect_continue_req;
use pingora::{Error, ErrorSource, ErrorType, Result, RetryType};
use pingora_proxy::{FailToProxy, ProxyHttp, ProxyWarnLogContext, Session};

use crate::access_log::{self, AccessLog};
use crate::admission::{Admission, declared_length};
use crate::auth::FailureBudget;
use crate::client_stream::ClientStream;
use crate::cors::{Cors, CorsPolicy};
use crate::deprecation::Deprecation;
use crate::errors::{GatewayError, client_went_away, respond, retract};
use crate::headers::{
    self, Piece, RateHeaders, X_API_KEY_ID, X_API_PLAN, X_FORWARDED_FOR, X_REQUEST_ID,
};
use crate::keyring::Keyring;
use crate::keys::ActiveKey;
use crate::metrics;
use crate::pages;
use crate::request_id::RequestId;
use crate::routes::{Route, Upstream};
use crate::settings::Settings;
use crate::store::LimitStore;
use crate::unix_ms;

/// Idle upstream connections (kept by each thread: `vendor/README.md`, pingora-proxy) are
/// closed after this long, counted from the start of the request that last used them, well
/// before a typical upstream's own keep-alive timeout, so the gateway never writes into a
/// connection the upstream has just closed.
const UPSTREAM_IDLE: Duration = Duration::from_secs(30);

/// After answering before the request body was read, the gateway reads and discards the rest of
/// it for up to this long, as nginx's `lingering_close` does: a client still sending would
/// otherwise get a connection reset instead of the answer.
const LINGER_TIME: Duration = Duration::from_secs(5);
/// ... and at most this many bytes; past it the connection is closed.
const LINGER_BYTES: usize = 64 * 1024 * 1024;

/// A refused request's body of at most this many bytes is read and discarded *before* the
/// refusal is sent, so that the answer can keep the connection open (as nginx's discarding of
/// a body does): a client whose POSTs are refused (401, 429) would otherwise open a new
/// connection, and over HTTPS make a new handshake, for every refusal.
const DISCARD_FIRST_BYTES: usize = 64 * 1024;
/// ... if it has all arrived within this long; else the refusal goes out and the connection
/// closes after it.
const DISCARD_FIRST_TIME: Duration = Duration::from_secs(1);

/// Reads and discards what is left of the request body, within `time` and `bytes`; a body
/// drained to its end leaves the connection reusable, one that is not closes it.
async fn discard_body(session: &mut Session, time: Duration, bytes: usize) {
    let deadline = tokio::time::Instant::now() + time;
    let mut drained = 0;
    while !session.is_body_done() {
        match tokio::time::timeout_at(deadline, session.read_request_body()).await {
            Ok(Ok(Some(chunk))) if drained + chunk.len() <= bytes => drained += chunk.len(),
            Ok(Ok(None)) => return,
            _ => {
                session.set_keepalive(None);
                return;
            }
        }
    }
}

/// Before a refusal: discards a small HTTP/1.1 request body ([`DISCARD_FIRST_BYTES`]) unless
/// the client waits for `100 Continue` before sending it (it is then answered at once, and the
/// connection closes).
async fn discard_small_body(session: &mut Session) {
    if session.is_body_done() || session.is_http2() {
        return;
    }
    let request = session.req_header();
    if is_expect_continue_req(request)
        || declared_length(request).is_some_and(|n| n > DISCARD_FIRST_BYTES as u64)
    {
        return;
    }
    discard_body(session, DISCARD_FIRST_TIME, DISCARD_FIRST_BYTES).await;
}

/// Whether `e`, the upstream's silence past the route's timeout, came while the client had not
/// sent the whole request body and no response had begun: the upstream was waiting for the
/// client. pingora restarts that timeout with each piece of the body it forwards, so a body sent
/// slowly but steadily is not this; one that stopped for the whole timeout is.
fn body_stalled(session: &mut Session, e: &Error) -> bool {
    e.etype == ErrorType::ReadTimedout
        && e.esource == ErrorSource::Upstream
        && final_response(session).is_none()
        && !session.is_body_done()
}

/// The response written to the client, if any: an interim `100 Continue` is not one.
fn final_response(session: &Session) -> Option<&ResponseHeader> {
    session
        .response_written()
        .filter(|r| !r.status.is_informational())
}

/// Whether pingora's error `e` says that the request's head could not be written upstream (as
/// the connection was reset): then no complete request reached it.
fn request_head_unsent(e: &Error) -> bool {
    e.etype == ErrorType::WriteError
        && e.context
            .as_ref()
            .is_some_and(|c| c.as_str().contains("request header"))
}

/// The instance of a pool that `ctx` went to could not be connected to, or closed the connection
/// unanswered: it leaves the rotation until its next passing health check, and with `retry`, the
/// request goes to another instance, once.
fn pass_over(ctx: &mut Ctx, e: &mut Error, retry: bool) {
    if let (Some(route), Some(instance)) = (&ctx.route, ctx.instance)
        && let Upstream::Pool(pool) = &route.upstream
    {
        pool.connection_failed(instance);
        route.publish_rotation();
        if retry && ctx.unreachable.is_none() {
            ctx.unreachable = Some(instance);
            e.set_retry(true);
        }
    }
}

/// After answering: the rest of the body, within [`LINGER_TIME`] and [`LINGER_BYTES`].
async fn linger(session: &mut Session) {
    discard_body(session, LINGER_TIME, LINGER_BYTES).await;
}

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
    unreachable: Option<SocketAddr>,
    /// The gateway's own answer that served the request (a page, a preflight, `rate_limit`),
    /// as it appears in metrics and the access log.
    pub answered: Option<&'static str>,
    upstream_started: Option<Instant>,
    /// The request's body stopped arriving while the upstream waited for it.
    body_stalled: bool,
    pub(crate) key: Option<Arc<ActiveKey>>,
    pub(crate) route: Option<Arc<Route>>,
    body_bytes: u64,
    started: Instant,
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
    fn upstream_labels(&self) -> (&str, String) {
        let route = self.route.as_ref().map_or("none", |r| r.prefix.as_str());
        let instance = self.instance.map(|i| i.to_string()).unwrap_or_default();
        (route, instance)
    }
}

/// The outcome of a request whose client went away before its response was complete, in
/// metrics and the access log (nginx logs such a request with its status 499).
const CLIENT_CLOSED: &str = "client_closed";

/// The outcome of a request whose body stopped arriving for the route's timeout: its connection
/// is closed without an answer (nginx logs such a request with its status 408).
const CLIENT_TIMEOUT: &str = "client_timeout";

/// The gateway's state shared by all requests.
pub struct Gateway {
    live: Arc<ArcSwap<Settings>>,
    pub(crate) keys: Arc<Keyring>,
    pub(crate) limits: Arc<LimitStore>,
    pub(crate) failures: FailureBudget,
    pub(crate) address_policy: HeaderValue,
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
        Ctx::new(self.live.load_full())
    }

    fn init_downstream_modules(&self, _modules: &mut pingora::modules::http::HttpModules) {
        // No compression module: the gateway never compresses, so it need not run per request.
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        // The first hook (pingora runs no module before it): from here on the request is ours.
        crate::connections::request_head_read(session.stream());
        // HTTP/1.1 keep-alive is unbounded in pingora: close idle clients as nginx does (over
        // TLS; plain connections are timed by `connections`). Off stays off: `Connection:
        // close` and HTTP/1.0 without keep-alive.
        if session.get_keepalive().is_some() {
            session.set_keepalive(Some(ctx.settings.keepalive_timeout.as_secs()));
        }
        let forwarded = session
            .req_header()
            .headers
            .get_all(&X_FORWARDED_FOR.parsed);
        ctx.client = ctx.settings.trusted_proxies.client(
            peer_ip(session),
            forwarded.iter().map(HeaderValue::as_bytes),
        );
        if let Some(page) = pages::public_page(session.req_header()) {
            // The API's pages are public: no key, nothing counted against one.
            ctx.now_ms = unix_ms();
            ctx.rate = Some(self.address_rate(self.failures.peek(ctx.client, ctx.now_ms)));
            ctx.cors = CorsPolicy::answer(ctx.settings.cors.as_deref(), session.req_header());
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
                discard_small_body(session).await;
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
        let Some(instance) = route.upstream.pick(ctx.unreachable) else {
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

    async fn connected_to_upstream(
        &self,
        _session: &mut Session,
        reused: bool,
        _peer: &HttpPeer,
        _fd: std::os::unix::io::RawFd,
        _digest: Option<&Digest>,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if !reused {
            let (route, instance) = ctx.upstream_labels();
            metrics::UPSTREAM_CONNECTIONS
                .with_label_values(&[route, &instance])
                .inc();
        }
        Ok(())
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut Ctx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        // A connection that could not be made (refused; timed out, as to a host that is gone;
        // unreachable) sent nothing upstream, so another instance of a pool may take the
        // request, whatever its method; once. (nginx's `proxy_next_upstream error timeout`.)
        pass_over(ctx, &mut e, true);
        e
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut Ctx,
        reused: bool,
    ) -> Box<Error> {
        let head_unsent = request_head_unsent(&e);
        let closed_before_answering = e.retry == RetryType::ReusedOnly;
        let mut e = e.more_context(format!("Peer: {peer}"));
        let body_kept = !session.as_ref().retry_buffer_truncated();
        if head_unsent && body_kept {
            // The connection was reset before the request's head was all written: nothing the
            // instance could act on reached it, whatever the method, so it is sent again as
            // after a refusal (a reused connection: anywhere, the instance may be fine).
            if reused {
                e.set_retry(true);
            } else {
                pass_over(ctx, &mut e, true);
            }
            return e;
        }
        // pingora's policy: a request that can be sent again (idempotent, its body still
        // buffered) is, when a reused connection turned out closed (the upstream's keep-alive
        // timeout raced it).
        let replayable = session.req_header().method.is_idempotent() && body_kept;
        if replayable {
            e.retry.decide_reuse(reused);
        } else {
            e.set_retry(false);
        }
        // And ours: a new connection closed or reset before a byte of the answer came is an
        // instance going down (its listener closed with this connection still queued) or gone
        // wrong. As a refused one, it takes the instance out of a pool's rotation, and a request
        // that can be sent again goes once to another instance (nginx's
        // `proxy_next_upstream error`, which too leaves out POST and PATCH).
        if closed_before_answering && !reused {
            pass_over(ctx, &mut e, replayable);
        }
        e
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        let received = upstream.headers.get(&X_FORWARDED_FOR.parsed);
        let forwarded =
            ctx.settings
                .trusted_proxies
                .forward(peer_ip(session), ctx.client, received);
        upstream.remove_header(&http::header::AUTHORIZATION);
        headers::with_request_headers(upstream, ctx.settings.header_case, |headers| {
            headers.insert_pieces(&X_REQUEST_ID, &[Piece::Id(&ctx.request_id)], false);
            headers.insert_pieces(&X_FORWARDED_FOR, &[Piece::Forwarded(&forwarded)], false);
            if let Some(key) = &ctx.key {
                headers.insert(&X_API_KEY_ID, key.id_header.clone());
                headers.insert(&X_API_PLAN, key.plan.clone());
            }
        });
        Ok(())
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if response.status.is_informational() && response.status != StatusCode::SWITCHING_PROTOCOLS
        {
            // An interim answer (`100 Continue` to `Expect`) is not the request's response: it
            // passes as the upstream sent it. pingora would take it for an answer written before
            // the request's body was read and close the connection after the final response.
            session.set_close_on_response_before_downstream_finish(false);
            return Ok(());
        }
        // The final response: written before the body was read, it closes the connection.
        session.set_close_on_response_before_downstream_finish(true);
        if let (Some(started), Some(route)) = (ctx.upstream_started, &ctx.route) {
            route
                .upstream_duration
                .observe(started.elapsed().as_secs_f64());
        }
        headers::decorate(response, ctx, session.is_http2())?;
        // A body of known length leaves whole, or not at all if the upstream breaks it off
        // before any of it left (`retract`): pingora flushes such a response early only when it
        // gives up on it.
        let bodyless = session.req_header().method == http::Method::HEAD
            || matches!(response.status.as_u16(), 101 | 204 | 304);
        if !bodyless
            && response
                .headers
                .get(http::header::CONTENT_LENGTH)
                .is_some_and(|length| length.as_bytes() != b"0")
            && let Some(stream) = session.as_downstream().stream()
        {
            ClientStream::hold(stream, true);
        }
        Ok(())
    }

    fn response_body_filter(
        &self,
        session: &mut Session,
        _body: &mut Option<Bytes>,
        end_of_stream: bool,
        _ctx: &mut Ctx,
    ) -> Result<Option<Duration>> {
        if end_of_stream && let Some(stream) = session.as_downstream().stream() {
            ClientStream::hold(stream, false);
        }
        Ok(None)
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy {
        // A client's silence, not the upstream's: closed without an answer, as a slow request
        // head is, rather than a 504 that blames the upstream.
        if body_stalled(session, e) {
            ctx.body_stalled = true;
            metrics::CLIENT_TIMEOUTS.with_label_values(&["body"]).inc();
            log::debug!("request {}: its body stopped arriving: {e}", ctx.request_id);
            return FailToProxy {
                error_code: 0,
                can_reuse_downstream: false,
            };
        }
        let answer = GatewayError::from_proxy_error(e, ctx.settings.max_body_bytes);
        match &answer {
            Some(error) if error.code == ErrorCode::InternalError => {
                log::error!("request {}: {e}", ctx.request_id);
            }
            // The client's own mistake (a body over the limit, or one that does not parse): as
            // every other refusal, counted and in the access log, not a warning.
            Some(error)
                if matches!(
                    error.code,
                    ErrorCode::PayloadTooLarge | ErrorCode::InvalidRequest
                ) =>
            {
                log::debug!("request {}: {}: {e}", ctx.request_id, error.code.as_str())
            }
            Some(error) => log::warn!("request {}: {}: {e}", ctx.request_id, error.code.as_str()),
            // Every load test ends with clients closing connections that have requests in
            // flight; nothing went wrong here.
            None => log::debug!("request {}: the client went away: {e}", ctx.request_id),
        }
        let mut code = 0;
        if let Some(error) = answer {
            let status = error.code.status();
            if final_response(session).is_none() {
                code = status;
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
            } else if retract(session, ctx, error).await {
                // The upstream's response began but none of it reached the client.
                code = status;
            }
        }
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    /// pingora's own line for a failed request would repeat, without the request id, what
    /// [`Self::fail_to_proxy`] has logged, and log a client that went away as an error.
    fn suppress_error_log(&self, _session: &Session, _ctx: &Ctx, _error: &Error) -> bool {
        true
    }

    /// pingora warns of every failed attempt that it tries again: with one instance of a pool
    /// down, each request sent there before the health check notices (within a second), 8,118
    /// lines in that second under wrk. The request is still served; the attempts are counted in
    /// `gateway_upstream_retries_total` and logged at debug. Other warnings pass.
    fn suppress_proxy_warn_log(
        &self,
        _session: &Session,
        ctx: &Ctx,
        error: &Error,
        context: ProxyWarnLogContext,
    ) -> bool {
        if context != ProxyWarnLogContext::UpstreamRetry {
            return false;
        }
        let (route, instance) = ctx.upstream_labels();
        metrics::UPSTREAM_RETRIES
            .with_label_values(&[route, &instance, error.etype().as_str()])
            .inc();
        log::debug!("request {}: tried again after {error}", ctx.request_id);
        true
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Ctx) {
        // Whatever became of the response, what is left of it may leave (see `response_filter`).
        if let Some(stream) = session.as_downstream().stream() {
            ClientStream::hold(stream, false);
        }
        // The gateway's own answer, if it gave one: it may have replaced a response that pingora
        // had begun (`retract`).
        let status = match ctx.status {
            0 => final_response(session).map_or(0, |r| r.status.as_u16()),
            own => own,
        };
        let outcome = match (ctx.error_code, ctx.answered, e) {
            (Some(code), _, _) => code.as_str(),
            (None, Some(_), _) => "answered",
            (None, None, _) if ctx.body_stalled => CLIENT_TIMEOUT,
            (None, None, Some(e)) if client_went_away(e) => CLIENT_CLOSED,
            (None, None, _) => "proxied",
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
                    request_id: ctx.request_id.as_str(),
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
                    decision: if ["proxied", CLIENT_CLOSED, CLIENT_TIMEOUT].contains(&outcome) {
                        "admitted"
                    } else {
                        outcome
                    },
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pingora::protocols::http::v1::client::HttpSession;

    /// pingora's own error for a request head written into a connection the upstream has reset
    /// (as an instance does that closes its listener with the connection queued) is one that
    /// sent nothing; an error on the body is not.
    #[tokio::test]
    async fn a_head_written_into_a_reset_connection_was_not_sent() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        accepted.set_zero_linger().unwrap();
        drop(accepted);
        // Returns once the reset has arrived.
        assert!(client.peek(&mut [0u8; 1]).await.is_err());
        let stream: pingora::protocols::l4::stream::Stream = client.into();
        let mut session = HttpSession::new(Box::new(stream));
        let head = RequestHeader::build("GET", b"/v1/store/orders/1", None).unwrap();
        let e = session
            .write_request_header(Box::new(head))
            .await
            .unwrap_err();
        assert!(request_head_unsent(&e), "{e}");
        assert!(!request_head_unsent(&Error::explain(
            ErrorType::WriteError,
            "while writing body"
        )));
    }
}
