//! Which failed attempts to reach an upstream are tried again, and where: pingora's own policy
//! (an idempotent request whose reused connection turned out closed) and the gateway's (a pool
//! instance that refused the connection, or closed a new one unanswered, is passed over for
//! another instance, once). The proxy's `fail_to_connect` and `error_while_proxy` phases call
//! these.

use pingora::{Error, ErrorType, RetryType};

use crate::context::Ctx;
use crate::routes::Upstream;

/// A connection that could not be made (refused; timed out, as to a host that is gone;
/// unreachable) sent nothing upstream, so another instance of a pool may take the request,
/// whatever its method; once. (nginx's `proxy_next_upstream error timeout`.)
pub(crate) fn after_connect_failed(ctx: &mut Ctx, mut e: Box<Error>) -> Box<Error> {
    pass_over(ctx, &mut e, true);
    e
}

/// The error `e` while proxying over a `reused` connection or a new one: whether and where the
/// request is sent again. `idempotent` is the request method's; `body_kept` says that the body
/// sent so far is still buffered, so it could be sent again.
pub(crate) fn after_proxy_error(
    ctx: &mut Ctx,
    mut e: Box<Error>,
    reused: bool,
    idempotent: bool,
    body_kept: bool,
) -> Box<Error> {
    let closed_before_answering = e.retry == RetryType::ReusedOnly;
    if request_head_unsent(&e) && body_kept {
        // The connection was reset before the request's head was all written: nothing the
        // instance could act on reached it, whatever the method, so it is sent again as after a
        // refusal (a reused connection: anywhere, the instance may be fine).
        if reused {
            e.set_retry(true);
        } else {
            pass_over(ctx, &mut e, true);
        }
        return e;
    }
    // pingora's policy: a request that can be sent again (idempotent, its body still buffered)
    // is, when a reused connection turned out closed (the upstream's keep-alive timeout raced
    // it).
    let replayable = idempotent && body_kept;
    if replayable {
        e.retry.decide_reuse(reused);
    } else {
        e.set_retry(false);
    }
    // And ours: a new connection closed or reset before a byte of the answer came is an instance
    // going down (its listener closed with this connection still queued) or gone wrong. As a
    // refused one, it takes the instance out of a pool's rotation, and a request that can be
    // sent again goes once to another instance (nginx's `proxy_next_upstream error`, which too
    // leaves out POST and PATCH).
    if closed_before_answering && !reused {
        pass_over(ctx, &mut e, replayable);
    }
    e
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

#[cfg(test)]
mod tests {
    use super::*;
    use pingora::http::RequestHeader;
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
