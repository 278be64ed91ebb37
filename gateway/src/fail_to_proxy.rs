//! What the client gets when proxying fails (pingora's `fail_to_proxy` phase): the contract's
//! error for the upstream's failure (502, 504) or the client's (413, 400), in place of a response
//! none of which has left yet ([`crate::errors::retract`]); nothing, and a closed connection, for
//! a client that stopped sending its body or went away.

use animal_store_contract::ErrorCode;
use pingora::{Error, ErrorSource, ErrorType};
use pingora_proxy::{FailToProxy, Session};

use crate::context::Ctx;
use crate::errors::{GatewayError, respond, retract};
use crate::proxy::final_response;
use crate::{lingering, metrics};

/// Answers the failure `e` of the request in `session`, if anyone is left to answer, and says
/// what pingora should record of it: the status sent (0 for none); the connection is not reused.
pub(crate) async fn answer(session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy {
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
                Ok(()) => lingering::after_answer(session).await,
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
