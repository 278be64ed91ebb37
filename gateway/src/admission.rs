//! What `request_filter` decides before anything is forwarded, in the order of the phase chart
//! in [`crate::proxy`]: the request line as sent, the body's framing and `Host`, the path's one
//! form, header limits, the route, CORS preflights, the key, `/v1/rate_limit`, the key's limits,
//! the route's existence, a sunset, the declared body size. Each refusal is a [`GatewayError`];
//! the proxy sends it.

use std::net::IpAddr;
use std::sync::Arc;

use animal_store_contract::{ErrorCode, RATE_LIMIT_PATH};
use http::HeaderValue;
use pingora::Result;
use pingora::http::RequestHeader;
use pingora_proxy::Session;

use crate::auth::{AuthFailure, Budget, authorize};
use crate::client_stream::ClientStream;
use crate::config::MAX_HEADERS;
use crate::context::Ctx;
use crate::cors::{self, CorsPolicy};
use crate::errors::{GatewayError, respond};
use crate::headers;
use crate::key_set::ActiveKey;
use crate::limits::{Verdict, ceil_secs};
use crate::metrics;
use crate::pages;
use crate::proxy::Gateway;
use crate::rate_headers::RateHeaders;
use crate::routes::normalize_path;
use crate::settings::Settings;
use crate::unix_ms;

/// What `admit` decided for a request that is not refused.
pub(crate) enum Admission {
    /// Forward it upstream.
    Forward,
    /// A CORS preflight: the gateway answers it.
    Preflight(Arc<CorsPolicy>),
    /// `GET /v1/rate_limit`: the gateway answers where this key stands.
    RateLimit(Arc<ActiveKey>),
}

impl Gateway {
    /// Every decision before forwarding, in the order of the phase chart; `Err` is the answer to
    /// send instead.
    pub(crate) async fn admit(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
    ) -> std::result::Result<Admission, GatewayError> {
        ctx.now_ms = unix_ms();
        let settings = ctx.settings.clone();
        let ip = ctx.client;
        let scan = HeaderScan::of(session.req_header());
        let line = match session.stream() {
            Some(stream) if ClientStream::request_line_invalid(stream) => Err(
                "the request line is not valid HTTP/1.1: its target has a space, a control \
                 character or DEL in it",
            ),
            _ => Ok(()),
        };
        let framing = line.and_then(|()| scan.framing(session.req_header().version));
        if framing.is_err() {
            // Whatever read the request before the gateway may have framed it otherwise: nothing
            // more is read from this connection.
            session.set_keepalive(None);
        }
        let refused = framing
            .and_then(|()| self.normalize(session))
            .map_err(str::to_owned)
            .and_then(|()| scan.size(&settings));
        if let Err(why) = refused {
            ctx.rate = Some(self.address_rate(self.failures.peek(ip, ctx.now_ms)));
            return Err(GatewayError::new(ErrorCode::InvalidRequest, why));
        }
        if scan.underscores {
            headers::drop_aliases(session.req_header_mut());
        }
        let request = session.req_header();
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
        ctx.cors = CorsPolicy::answer(policy.map(|p| &**p), request);
        if let Some(policy) = policy.filter(|_| cors::is_preflight(request)) {
            // A preflight never carries a key: answered without one, and counted nowhere.
            ctx.rate = Some(self.address_rate(self.failures.peek(ip, ctx.now_ms)));
            return Ok(Admission::Preflight(policy.clone()));
        }

        let key = self.authenticate(request, ip, ctx)?;
        if path == RATE_LIMIT_PATH {
            ctx.key = Some(key.clone());
            if request.method != http::Method::GET && request.method != http::Method::HEAD {
                return Err(GatewayError::new(
                    ErrorCode::MethodNotAllowed,
                    "the rate_limit resource is read with GET",
                )
                .allow("GET, HEAD"));
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
        if declared_length(session.req_header()).is_some_and(|len| len > settings.max_body_bytes) {
            return Err(GatewayError::too_large(settings.max_body_bytes));
        }
        Ok(Admission::Forward)
    }

    /// Answers `GET /v1/rate_limit` for `key`, counting nothing.
    pub(crate) async fn rate_limit(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        key: &Arc<ActiveKey>,
    ) -> Result<()> {
        let Ok(standing) = self.limits.peek(key.counters, key.limits, ctx.now_ms).await else {
            ctx.rate = Some(undecided(key, ctx.now_ms));
            return respond(session, ctx, limit_store_unavailable()).await;
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
        let loaded = self.keys.loaded(); // before the set, which is then the one it speaks of
        let mut authorization = request.headers.get_all(http::header::AUTHORIZATION).iter();
        let first = authorization.next().map(HeaderValue::as_bytes);
        let decided = match authorization.next() {
            None => authorize(first, &self.keys.current(), ctx.now_ms),
            Some(_) => Err(AuthFailure::Repeated),
        };
        let failure = match decided {
            Ok(key) => {
                key.touch(ctx.now_ms);
                return Ok(key);
            }
            Err(AuthFailure::UnknownKey) if !loaded => {
                // No keys were ever read (Redis away since the start, no local copy): the key
                // may well be valid, so it is neither refused as invalid nor counted as a failure.
                ctx.rate = Some(self.address_rate(self.failures.peek(ip, ctx.now_ms)));
                return Err(GatewayError::new(
                    ErrorCode::Unavailable,
                    "the key store has not been loaded yet; retry shortly",
                )
                .retry_after(Some(1)));
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
            ctx.rate = Some(undecided(key, ctx.now_ms));
            return Err(limit_store_unavailable());
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
    pub(crate) fn address_rate(&self, budget: Budget) -> RateHeaders {
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

/// What one pass over a request's headers found, for the refusals that read them all.
#[derive(Debug, Default, Clone, Copy)]
struct HeaderScan {
    /// How many headers.
    count: usize,
    /// The bytes of the request target and of the headers' names and values: what is forwarded
    /// of the head.
    bytes: usize,
    /// `Content-Length` values, each of a list counted.
    lengths: usize,
    /// `Transfer-Encoding` lines.
    codings: usize,
    /// Whether each of those is exactly `chunked`.
    only_chunked: bool,
    /// Whether there is a `Host`.
    host: bool,
    /// Whether some name has a `_` (see [`headers::drop_aliases`]).
    underscores: bool,
}

impl HeaderScan {
    fn of(request: &RequestHeader) -> HeaderScan {
        use http::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
        let mut scan = HeaderScan {
            count: request.headers.len(),
            bytes: request.raw_path().len(),
            only_chunked: true,
            ..HeaderScan::default()
        };
        for (name, value) in &request.headers {
            let name_bytes = name.as_str().as_bytes();
            scan.bytes += name_bytes.len() + value.len();
            scan.underscores |= name_bytes.contains(&b'_');
            if name == CONTENT_LENGTH {
                scan.lengths += 1 + value.as_bytes().iter().filter(|&&b| b == b',').count();
            } else if name == TRANSFER_ENCODING {
                scan.codings += 1;
                scan.only_chunked &= value
                    .as_bytes()
                    .trim_ascii()
                    .eq_ignore_ascii_case(b"chunked");
            } else if name == HOST {
                scan.host = true;
            }
        }
        scan
    }

    /// Refuses a body two readers could frame differently, which a proxy must not forward as it
    /// came (RFC 9112 section 6, RFC 9110 section 8.6): `Content-Length` given twice or as a
    /// list, and a transfer coding other than one `chunked` (the gateway decodes no other, and
    /// would forward the body without it). Refuses an HTTP/1.1 request without `Host` too
    /// (RFC 9112 section 3.2). pingora has already refused differing lengths, and dropped
    /// `Content-Length` beside `Transfer-Encoding`, closing the connection after the answer.
    fn framing(&self, version: http::Version) -> std::result::Result<(), &'static str> {
        if self.lengths > 1 {
            return Err("a request gives its Content-Length once, as one number");
        }
        if self.codings > 1 || !self.only_chunked {
            return Err("the only Transfer-Encoding the gateway accepts is one chunked coding");
        }
        if version == http::Version::HTTP_11 && !self.host {
            return Err("an HTTP/1.1 request needs a Host header");
        }
        Ok(())
    }

    /// Refuses more headers, or a longer head (target and headers), than are forwarded.
    fn size(&self, settings: &Settings) -> std::result::Result<(), String> {
        if self.count > MAX_HEADERS {
            return Err(format!("a request may carry at most {MAX_HEADERS} headers"));
        }
        if self.bytes > settings.max_header_bytes {
            return Err(format!(
                "the request target and headers are larger than {} bytes together",
                settings.max_header_bytes
            ));
        }
        Ok(())
    }
}

/// The body length `request` declares (`Content-Length`), if it declares one that parses.
pub(crate) fn declared_length(request: &RequestHeader) -> Option<u64> {
    let value = request.headers.get(http::header::CONTENT_LENGTH)?;
    value.to_str().ok()?.parse().ok()
}

/// The refusal of a request no limit store can decide (Redis away with `fallback = "deny"`).
fn limit_store_unavailable() -> GatewayError {
    GatewayError::new(
        ErrorCode::Unavailable,
        "the shared limit store cannot be reached; retry shortly",
    )
    .retry_after(Some(LIMIT_STORE_RETRY_SECONDS))
}

/// What the refusal's headers say of `key`'s limits: nothing left until the retry it asks for.
fn undecided(key: &ActiveKey, now_ms: u64) -> RateHeaders {
    RateHeaders::while_undecided(
        key.limits,
        &key.policy,
        now_ms + LIMIT_STORE_RETRY_SECONDS * 1000,
    )
}

/// How long a client is asked to wait when no limit store can decide its request.
const LIMIT_STORE_RETRY_SECONDS: u64 = 1;
