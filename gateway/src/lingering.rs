//! What the gateway does with a request body it will not forward: a small one is read before a
//! refusal, so the refusal can keep the connection open; whatever is left after an answer is
//! read for a while ("lingering", as nginx's `lingering_close`), so a client still sending gets
//! the answer rather than a connection reset.

use std::time::Duration;

use pingora::protocols::http::v1::common::is_expect_continue_req;
use pingora_proxy::Session;

use crate::admission::declared_length;

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

/// Before a refusal: reads and discards a small HTTP/1.1 request body ([`DISCARD_FIRST_BYTES`])
/// unless the client waits for `100 Continue` before sending it (it is then answered at once, and
/// the connection closes).
pub(crate) async fn before_refusal(session: &mut Session) {
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

/// After answering: the rest of the body, within [`LINGER_TIME`] and [`LINGER_BYTES`].
pub(crate) async fn after_answer(session: &mut Session) {
    discard_body(session, LINGER_TIME, LINGER_BYTES).await;
}
