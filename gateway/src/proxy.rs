//! The proxy: orchestrates pingora's phases; every decision is made by the modules it calls
//! ([`crate::admission`] for all of `request_filter`'s, [`crate::retries`] for which failed
//! attempts are tried again, [`crate::fail_to_proxy`] for what a failure is answered with,
//! [`crate::outcome`] for what `logging` records), and the request's state is a [`Ctx`]. Before
//! the first phase, and between requests of a connection, [`crate::connections`] holds the
//! client connection and times it.
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
//!                         X-Forwarded-Proto (the connection's scheme, or a trusted proxy's),
//!                         X-Api-Key-Id, X-Api-Plan (the client's spellings of them with `_`
//!                         were dropped in request_filter; pingora itself drops hop-by-hop
//!                         headers and those the client's Connection header names)
//! response_filter         rate-limit, request-id, CORS and deprecation headers (not on an
//!                         interim `100 Continue`, which leaves the connection reusable)
//! fail_to_proxy           upstream unreachable → 502, too slow → 504 (JSON, same headers);
//!                         also in place of a response it broke off before any of it left
//! logging                 metrics and the access log (key id only, never the key)
//! ```

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::protocols::Digest;
use pingora::{Error, ErrorType, Result};
use pingora_proxy::{FailToProxy, ProxyHttp, ProxyWarnLogContext, Session};

use crate::admission::Admission;
use crate::auth::FailureBudget;
use crate::client_stream::ClientStream;
use crate::context::Ctx;
use crate::cors::CorsPolicy;
use crate::errors::{EarlyRefusals, respond};
use crate::fail_to_proxy;
use crate::headers::{
    self, Piece, X_API_KEY_ID, X_API_PLAN, X_FORWARDED_FOR, X_FORWARDED_PROTO, X_REQUEST_ID,
};
use crate::keyring::Keyring;
use crate::lingering;
use crate::metrics;
use crate::outcome;
use crate::pages;
use crate::rate_headers;
use crate::retries;
use crate::settings::Settings;
use crate::store::LimitStore;
use crate::unix_ms;

/// Idle upstream connections (kept by each thread: `vendor/README.md`, pingora-proxy) are
/// closed after this long, counted from the start of the request that last used them, well
/// before a typical upstream's own keep-alive timeout, so the gateway never writes into a
/// connection the upstream has just closed.
const UPSTREAM_IDLE: Duration = Duration::from_secs(30);

/// The response written to the client, if any: an interim `100 Continue` is not one.
pub(crate) fn final_response(session: &Session) -> Option<&ResponseHeader> {
    session
        .response_written()
        .filter(|r| !r.status.is_informational())
}

/// The gateway's state shared by all requests.
pub struct Gateway {
    live: Arc<ArcSwap<Settings>>,
    pub(crate) keys: Arc<Keyring>,
    pub(crate) limits: Arc<LimitStore>,
    pub(crate) failures: Arc<FailureBudget>,
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
            failures: Arc::new(FailureBudget::new(settings.auth_failures_per_minute)),
            address_policy: rate_headers::address_policy(settings.auth_failures_per_minute),
            live,
            keys,
        }
    }

    /// What the public listener's connections answer the requests pingora refuses before this
    /// proxy sees them with: the same configuration and failed-authentication budgets.
    pub fn early_refusals(&self) -> Arc<EarlyRefusals> {
        Arc::new(EarlyRefusals::new(
            self.live.clone(),
            self.failures.clone(),
            self.address_policy.clone(),
        ))
    }
}

/// The TCP peer's address.
pub(crate) fn peer_ip(session: &Session) -> IpAddr {
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
                lingering::before_refusal(session).await;
                respond(session, ctx, error).await?;
                lingering::after_answer(session).await;
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
        e: Box<Error>,
    ) -> Box<Error> {
        retries::after_connect_failed(ctx, e)
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut Ctx,
        reused: bool,
    ) -> Box<Error> {
        let idempotent = session.req_header().method.is_idempotent();
        let body_kept = !session.as_ref().retry_buffer_truncated();
        // Decided on pingora's own error: the context added here would hide it.
        retries::after_proxy_error(ctx, e, reused, idempotent, body_kept)
            .more_context(format!("Peer: {peer}"))
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        let (peer, trusted) = (peer_ip(session), &ctx.settings.trusted_proxies);
        let received = upstream.headers.get(&X_FORWARDED_FOR.parsed);
        let forwarded = trusted.forward(peer, ctx.client, received);
        let tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
        let received = upstream.headers.get(&X_FORWARDED_PROTO.parsed);
        let scheme = trusted.scheme(peer, tls, received);
        upstream.remove_header(&http::header::AUTHORIZATION);
        headers::with_request_headers(upstream, ctx.settings.header_case, |headers| {
            headers.insert_pieces(&X_REQUEST_ID, &[Piece::Id(&ctx.request_id)], false);
            headers.insert_pieces(&X_FORWARDED_FOR, &[Piece::Forwarded(&forwarded)], false);
            headers.insert_pieces(&X_FORWARDED_PROTO, &[Piece::Text(scheme)], false);
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
        fail_to_proxy::answer(session, e, ctx).await
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
        outcome::record(session, e, ctx);
    }
}
