//! The gateway's own answers: one error type and the one helper that writes it, with the
//! contract's JSON body and every header a response of the public listener must carry.

use std::net::IpAddr;
use std::sync::Arc;

use animal_store_contract::{ErrorBody, ErrorCode, JSON_CONTENT_TYPE};
use arc_swap::ArcSwap;
use bytes::Bytes;
use http::HeaderValue;
use pingora::http::ResponseHeader;
use pingora::protocols::http::date::get_cached_date;
use pingora::{Error, ErrorSource, ErrorType};
use pingora_proxy::Session;

use crate::auth::FailureBudget;
use crate::client_stream::ClientStream;
use crate::context::Ctx;
use crate::rate_headers::RateHeaders;
use crate::settings::Settings;
use crate::{headers, metrics, unix_ms};

/// An answer the gateway gives itself instead of (or after failing at) forwarding.
#[derive(Debug, Clone)]
pub struct GatewayError {
    /// The contract code; it fixes the status.
    pub code: ErrorCode,
    /// A sentence for people: names what is wrong, never internals or the key.
    pub message: String,
    /// `Retry-After`, in whole seconds, for 429.
    pub retry_after: Option<u64>,
    /// `Allow`, for 405.
    pub allow: Option<&'static str>,
}

impl GatewayError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> GatewayError {
        GatewayError {
            code,
            message: message.into(),
            retry_after: None,
            allow: None,
        }
    }

    /// The contract's JSON body for this error.
    pub fn body(&self) -> Vec<u8> {
        ErrorBody::new(self.code, self.message.as_str()).to_json()
    }

    /// 413 for a body over `max_body_bytes`, whether its length was declared or it was streamed.
    pub fn too_large(max_body_bytes: u64) -> GatewayError {
        GatewayError::new(
            ErrorCode::PayloadTooLarge,
            format!("the request body is larger than {max_body_bytes} bytes"),
        )
    }

    /// The contract's answer for an error pingora raised while proxying (a streamed body found
    /// over `max_body_bytes` among them); `None` when the client is gone and nobody is left to
    /// answer.
    pub fn from_proxy_error(e: &Error, max_body_bytes: u64) -> Option<GatewayError> {
        use ErrorType::*;
        if client_went_away(e) {
            return None;
        }
        let error = match (e.etype(), e.esource()) {
            (HTTPStatus(413), _) => GatewayError::too_large(max_body_bytes),
            (ReadTimedout | WriteTimedout, ErrorSource::Upstream) => GatewayError::new(
                ErrorCode::GatewayTimeout,
                "the upstream service did not answer in time",
            ),
            (_, ErrorSource::Upstream) => GatewayError::new(
                ErrorCode::BadGateway,
                "the upstream service could not be reached or answered badly",
            ),
            (_, ErrorSource::Downstream) => {
                GatewayError::new(ErrorCode::InvalidRequest, "the request could not be read")
            }
            _ => GatewayError::new(ErrorCode::InternalError, "an internal error occurred"),
        };
        Some(error)
    }

    /// The same error with an `Allow` header (for 405).
    pub fn allow(mut self, methods: &'static str) -> GatewayError {
        self.allow = Some(methods);
        self
    }

    /// The same error with a `Retry-After`.
    pub fn retry_after(mut self, seconds: Option<u64>) -> GatewayError {
        self.retry_after = seconds;
        self
    }
}

/// Whether `e` says the client went away: it closed or reset its connection, cancelled its
/// HTTP/2 stream, or stopped sending or reading for longer than the timeouts allow.
pub fn client_went_away(e: &Error) -> bool {
    use ErrorType::*;
    *e.esource() == ErrorSource::Downstream
        && match e.etype() {
            ReadError | WriteError | ConnectionClosed | ReadTimedout => true,
            H2Error => h2_client_gone(e),
            _ => false,
        }
}

/// Whether an HTTP/2 error, or one it wraps, is the client's leaving: pingora says "Client
/// closed H2" (in words only) when the client reset the stream, and wraps the `h2` crate's
/// error when the connection ended or the client reset or closed it. A protocol error of the
/// client's is none of these.
fn h2_client_gone(e: &Error) -> bool {
    if e.context
        .as_ref()
        .is_some_and(|c| c.as_str().starts_with("Client closed H2"))
    {
        return true;
    }
    let Some(cause) = e.cause.as_deref() else {
        return false;
    };
    // pingora wraps its own error as the `Box<Error>` it was, boxed once more.
    if let Some(inner) = cause.downcast_ref::<Box<Error>>() {
        return h2_client_gone(inner);
    }
    cause
        .downcast_ref::<h2::Error>()
        .is_some_and(|h2| h2.is_io() || h2.is_remote())
}

/// Writes `error` as the complete response, with the rate-limit, request-id and (on a
/// deprecated operation) deprecation headers from `ctx`. Records the status in `ctx`.
pub async fn respond(
    session: &mut Session,
    ctx: &mut Ctx,
    error: GatewayError,
) -> pingora::Result<()> {
    let (response, body) = error_response(ctx, error)?;
    send(session, ctx, response, JSON_CONTENT_TYPE, body).await
}

/// The head (without the headers [`complete`] adds) and body of `error`'s response. Records
/// the error in `ctx`.
fn error_response(ctx: &mut Ctx, error: GatewayError) -> pingora::Result<(ResponseHeader, Bytes)> {
    let body = Bytes::from(error.body());
    let mut response = ResponseHeader::build(error.code.status(), Some(10))?;
    if error.code == ErrorCode::Unauthorized {
        response.insert_header("WWW-Authenticate", "Bearer")?;
    }
    if let Some(seconds) = error.retry_after {
        response.insert_header("Retry-After", seconds)?;
    }
    if let Some(methods) = error.allow {
        response.insert_header("Allow", methods)?;
    }
    ctx.error_code = Some(error.code);
    Ok((response, body))
}

/// Sends a complete response the gateway wrote itself: sets the body's type and length (keep-
/// alive clients need it) and every header the public listener's responses carry.
pub async fn send(
    session: &mut Session,
    ctx: &mut Ctx,
    mut response: ResponseHeader,
    content_type: &str,
    body: Bytes,
) -> pingora::Result<()> {
    complete(&mut response, ctx, session.is_http2(), content_type, &body)?;
    // The answer to HEAD is GET's head alone. pingora leaves the body out over HTTP/1.1 but not
    // over HTTP/2, where a body after HEAD is a protocol error that fails the client's stream.
    let head_only = session.req_header().method == http::Method::HEAD;
    session
        .write_response_header(Box::new(response), head_only)
        .await?;
    if head_only {
        return Ok(());
    }
    session.write_response_body(Some(body), true).await
}

/// Adds to the head of a response the gateway wrote itself the body's type and length, and
/// every header the public listener's responses carry. Records the status in `ctx`.
fn complete(
    response: &mut ResponseHeader,
    ctx: &mut Ctx,
    http2: bool,
    content_type: &str,
    body: &[u8],
) -> pingora::Result<()> {
    // A 304's head is that of the 200 it stands for, less its body's type and length.
    if !matches!(
        response.status,
        http::StatusCode::NO_CONTENT | http::StatusCode::NOT_MODIFIED
    ) {
        response.insert_header("Content-Type", content_type)?;
        response.insert_header("Content-Length", body.len())?;
    }
    headers::decorate(response, ctx, http2)?;
    ctx.status = response.status.as_u16();
    Ok(())
}

/// Answers `error` in place of a response pingora has begun but none of which has left the
/// gateway (an upstream that closed or stalled mid-body, before the client had a byte of it;
/// see [`ClientStream::retract`]), then closes the connection. `false`, and nothing written, if
/// some of it has left, or over HTTP/2, whose streams the gateway does not gather.
pub async fn retract(session: &mut Session, ctx: &mut Ctx, error: GatewayError) -> bool {
    let Some(stream) = session.as_downstream().stream() else {
        return false;
    };
    if session.is_http2() || !ClientStream::unsent(stream) {
        return false;
    }
    let Ok(wire) = retraction(session, ctx, error) else {
        return false;
    };
    if !ClientStream::retract(stream, wire) {
        return false;
    }
    session.set_keepalive(None);
    // Writes what replaced the response, and closes.
    session.as_downstream_mut().shutdown().await;
    true
}

/// `error`'s whole HTTP/1.1 response, as [`respond`] would have sent it, and `Connection: close`.
fn retraction(session: &Session, ctx: &mut Ctx, error: GatewayError) -> pingora::Result<Vec<u8>> {
    closing_wire(
        ctx,
        error,
        session.req_header().method == http::Method::HEAD,
    )
}

/// `error`'s whole HTTP/1.1 response with every header of the public listener's from `ctx`,
/// `Connection: close`, and its body unless `head_only`.
fn closing_wire(ctx: &mut Ctx, error: GatewayError, head_only: bool) -> pingora::Result<Vec<u8>> {
    let (mut response, body) = error_response(ctx, error)?;
    complete(&mut response, ctx, false, JSON_CONTENT_TYPE, &body)?;
    response.insert_header(http::header::DATE, get_cached_date())?;
    response.insert_header(http::header::CONNECTION, "close")?;
    let mut wire = Vec::with_capacity(512 + body.len());
    wire.extend_from_slice(b"HTTP/1.1 ");
    wire.extend_from_slice(response.status.as_str().as_bytes());
    wire.push(b' ');
    wire.extend_from_slice(response.get_reason_phrase().unwrap_or_default().as_bytes());
    wire.extend_from_slice(b"\r\n");
    response.header_to_h1_wire(&mut wire);
    wire.extend_from_slice(b"\r\n");
    if !head_only {
        wire.extend_from_slice(&body);
    }
    Ok(wire)
}

/// The error for a request that is not valid HTTP/1.1, on either listener.
pub fn unparsable() -> GatewayError {
    GatewayError::new(
        ErrorCode::InvalidRequest,
        "the request is not valid HTTP/1.1: its request line or a header cannot be parsed, its \
         Host is given twice or differs from the host in its target, or its headers are too large",
    )
}

/// What the public listener's connections need to answer a request pingora refused before the
/// gateway saw it (see [`crate::client_stream`]) as the gateway answers every request there: the
/// configuration in force, and the client address's failed-authentication budget, which its
/// rate-limit headers describe (as for every request without a valid key).
pub struct EarlyRefusals {
    live: Arc<ArcSwap<Settings>>,
    failures: Arc<FailureBudget>,
    address_policy: HeaderValue,
}

impl std::fmt::Debug for EarlyRefusals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EarlyRefusals").finish_non_exhaustive()
    }
}

impl EarlyRefusals {
    /// Refusals with the configuration in `live`, describing the budgets of `failures`.
    pub(crate) fn new(
        live: Arc<ArcSwap<Settings>>,
        failures: Arc<FailureBudget>,
        address_policy: HeaderValue,
    ) -> EarlyRefusals {
        EarlyRefusals {
            live,
            failures,
            address_policy,
        }
    }

    /// The whole HTTP/1.1 response that replaces pingora's bare answer to a request from `peer`
    /// (the TCP peer) it refused: for pingora's `400`, a request that is not valid HTTP/1.1,
    /// `400 invalid_request`; for its `405`, a `CONNECT`, `405 method_not_allowed` with an empty
    /// `Allow` (an authority has no methods). Any other status is not one of those answers:
    /// `None`. The connection closes after it, as pingora's did, and the response is counted in
    /// `gateway_responses_total` (route `none`). Nothing of the request can be believed, its
    /// `X-Forwarded-For` included: its client is the peer, even a trusted proxy.
    pub fn answer(&self, status: u16, peer: IpAddr) -> Option<Vec<u8>> {
        let error = match status {
            400 => unparsable(),
            405 => GatewayError::new(
                ErrorCode::MethodNotAllowed,
                "CONNECT is not supported: the gateway is not a forward proxy",
            )
            .allow(""),
            _ => return None,
        };
        metrics::RESPONSES
            .with_label_values(&[
                "none",
                "other",
                metrics::status_label(status),
                error.code.as_str(),
            ])
            .inc();
        let mut ctx = Ctx::new(self.live.load_full());
        ctx.now_ms = unix_ms();
        ctx.client = peer;
        let budget = self.failures.peek(ctx.client, ctx.now_ms);
        ctx.rate = Some(RateHeaders::for_address(&budget, &self.address_policy));
        closing_wire(&mut ctx, error, false).ok()
    }
}
