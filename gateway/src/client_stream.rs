//! A client connection's transport as the gateway uses it: writes gathered in a buffer that
//! exists only while a response is being written, and reads cut at the end of each HTTP/1.1
//! request head ([`crate::pipeline`]).
//!
//! A response's head and body are written separately; buffered, they leave in one system call
//! (and over TLS in one record). pingora's transport has such a buffer, but it is allocated with
//! the connection and kept for as long as the connection lives: 1,460 bytes in every idle
//! keep-alive connection, 14 MiB for 10,000 of them. [`ClientStream`] coalesces the writes
//! above the transport instead, in a buffer taken when a response's first bytes are written and
//! given back when they are flushed, so a connection waiting for its next request holds none.
//! The listeners turn the transport's own write buffer off.
//!
//! Nor does a waiting connection hold a read buffer. The keep-alive loop waits for the next
//! request with a zero-length read; here, that read takes what arrives into room on the stack
//! and holds it ([`crate::pipeline::Heads`]) until the request's reads take it. The transport's
//! read buffer, which the wait used to fill, is off too: 1 KiB in each idle connection before.
//!
//! pingora answers a request it cannot parse (or a `CONNECT`) itself, with a bare `400` (`405`)
//! and no body, before any hook of the gateway runs. On HTTP/1 connections the stream knows
//! whether the gateway has the request being served ([`ClientStream::expect_request`],
//! [`ClientStream::mark_answering`]); a response that starts while it does not is pingora's own,
//! and is replaced with the contract's JSON error ([`crate::errors::refusal_before_proxy`]).
//!
//! The same gathering lets the gateway take a response back. pingora writes a response's head
//! before its body has arrived, and leaves a head with `Content-Length` unflushed; an upstream that
//! then closes or stalls mid-body would leave the client with nothing at all, not even the head.
//! While no byte of the response has left, the gateway replaces it with its own error
//! ([`ClientStream::retract`]). pingora flushes a response with `Content-Length` only at its end,
//! and when it gives up on it; while its body is incomplete, the proxy holds such flushes back
//! ([`ClientStream::hold`]), so that giving up leaves room for the error.
//!
//! And the stream checks each request line in the bytes the client sent, before pingora can
//! correct it ([`crate::request_line`], [`ClientStream::request_line_invalid`]).

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use async_trait::async_trait;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::tls::{SslDigest, TlsRef};
use pingora::protocols::{
    ALPN, GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl,
    Stream, TimingDigest, UniqueID, UniqueIDType,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::errors;
use crate::pipeline::Heads;
use crate::request_line;

/// How much of a response is gathered before it is written: a head and a page of pets. Larger
/// writes go straight through.
pub const CAPACITY: usize = 4096;

/// The most a connection's wait for its next request reads ([`ClientStream`]'s zero-length
/// read): a request head of common size, whole. What a longer one brings after it, the
/// request's own reads take from the connection.
const WAIT_READ: usize = 4096;

/// `inner` with its writes gathered in a buffer that lives from a response's first write to its
/// flush, and on HTTP/1 its reads cut at request heads.
#[derive(Debug)]
pub struct ClientStream {
    inner: Stream,
    buf: Vec<u8>,
    /// How much of `buf` has been written to `inner`.
    written: usize,
    /// On an HTTP/1 connection, the requests read behind the one being served.
    heads: Option<Heads>,
    /// Who answers the request being served: [`GATEWAY`], [`PINGORA`] until the gateway's proxy
    /// has it, [`RETRACTED`] when the gateway takes back the response being written, or
    /// [`REPLACED`] once pingora's answer has been replaced.
    answering: AtomicU8,
    /// Whether any byte of the response to the request being served has left for the client.
    sent: AtomicBool,
    /// What replaces the response being written, once it is [`RETRACTED`].
    retraction: ArcSwapOption<Vec<u8>>,
    /// Flushes wait: a response's body of known length is being written and is not whole yet.
    holding: AtomicBool,
    /// How far the check of the request line being read has got ([`request_line::State`]).
    line: AtomicU8,
}

/// The gateway's proxy has the request (and every connection it does not drive, e.g. HTTP/2).
const GATEWAY: u8 = 0;
/// A request is being read, and only pingora has seen it.
const PINGORA: u8 = 1;
/// pingora's answer was replaced by the gateway's: what pingora writes after it is dropped.
const REPLACED: u8 = 2;
/// The gateway took back the response being written: what was gathered of it is dropped for
/// [`ClientStream::retraction`], and so is what pingora writes after it.
const RETRACTED: u8 = 3;

impl ClientStream {
    /// Buffers the writes to `inner`, whose own write buffer should be off; over HTTP/1 (no
    /// ALPN, or `http/1.1`), cuts its reads at request heads.
    pub fn wrap(inner: Stream) -> Stream {
        let http1 = matches!(inner.selected_alpn_proto(), None | Some(ALPN::H1));
        Box::new(ClientStream {
            inner,
            buf: Vec::new(),
            written: 0,
            heads: http1.then(Heads::default),
            answering: AtomicU8::new(GATEWAY),
            sent: AtomicBool::new(false),
            retraction: ArcSwapOption::empty(),
            holding: AtomicBool::new(false),
            line: AtomicU8::new(request_line::VALID),
        })
    }

    /// A new request is about to be read on `stream` (the keep-alive loop's call): until the
    /// gateway's proxy has it, an answer is pingora's own; its request line is checked as it is
    /// read.
    pub fn expect_request(stream: &Stream) {
        if let Some(stream) = stream.as_any().downcast_ref::<ClientStream>() {
            stream.answering.store(PINGORA, Ordering::Relaxed);
            stream.sent.store(false, Ordering::Relaxed);
            stream.holding.store(false, Ordering::Relaxed);
            stream.line.store(request_line::START, Ordering::Relaxed);
        }
    }

    /// Whether the request being served on `stream` came with a request line that is not valid
    /// HTTP/1.1, which pingora corrected ([`crate::request_line`]).
    pub fn request_line_invalid(stream: &Stream) -> bool {
        stream
            .as_any()
            .downcast_ref::<ClientStream>()
            .is_some_and(|s| s.line.load(Ordering::Relaxed) == request_line::INVALID)
    }

    /// The gateway's proxy has the request being served on `stream` (its first hook's call).
    pub fn mark_answering(stream: &Stream) {
        if let Some(stream) = stream.as_any().downcast_ref::<ClientStream>() {
            stream.answering.store(GATEWAY, Ordering::Relaxed);
            stream.sent.store(false, Ordering::Relaxed);
            stream.holding.store(false, Ordering::Relaxed);
        }
    }

    /// Takes back the response being written on `stream` if none of it has left yet: `response`
    /// (a whole HTTP/1.1 response) is written in its place at the next flush, and whatever
    /// pingora writes after it is dropped. `false` when some of it has left, or when `stream`
    /// is not a gathering one (an HTTP/2 connection's streams are not written here).
    pub fn retract(stream: &Stream, response: Vec<u8>) -> bool {
        if !Self::unsent(stream) {
            return false;
        }
        let Some(stream) = stream.as_any().downcast_ref::<ClientStream>() else {
            return false;
        };
        stream.retraction.store(Some(Arc::new(response)));
        stream.answering.store(RETRACTED, Ordering::Relaxed);
        true
    }

    /// While `on`, flushes on `stream` (an HTTP/1 one) write nothing out: what is gathered stays
    /// until the flush after `hold(stream, false)`, or until it outgrows the buffer. For a
    /// response whose body has a known length, from its head until its body is whole.
    pub fn hold(stream: &Stream, on: bool) {
        if let Some(stream) = stream.as_any().downcast_ref::<ClientStream>()
            && stream.heads.is_some()
        {
            stream.holding.store(on, Ordering::Relaxed);
        }
    }

    /// Whether `stream` is an HTTP/1 connection that gathers writes and no byte of the response
    /// being written has left it, so that [`ClientStream::retract`] would take it back.
    pub fn unsent(stream: &Stream) -> bool {
        stream
            .as_any()
            .downcast_ref::<ClientStream>()
            .is_some_and(|s| s.heads.is_some() && !s.sent.load(Ordering::Relaxed))
    }

    /// Puts the gateway's answer in place of pingora's writes, if one is due: a retraction, or,
    /// for the first write of a response that only pingora has seen the request of, the
    /// gateway's version of the refusal its status line names. Whatever pingora writes after it
    /// is dropped.
    fn replace(&mut self, data: &[u8]) {
        let state = self.answering.get_mut();
        if *state == RETRACTED {
            let response = self.retraction.swap(None).map(Arc::unwrap_or_clone);
            self.buf = response.unwrap_or_default();
            self.written = 0;
            *state = REPLACED;
        } else if *state == PINGORA {
            let status = data
                .get(9..12)
                .filter(|_| data.starts_with(b"HTTP/1."))
                .and_then(|digits| std::str::from_utf8(digits).ok()?.parse().ok());
            match status.and_then(errors::refusal_before_proxy) {
                Some(response) => {
                    self.buf = response;
                    *state = REPLACED;
                }
                // Not a refusal pingora makes before the proxy: let it through.
                None => *state = GATEWAY,
            }
        }
    }

    /// Writes what is buffered to `inner`, then gives the buffer back.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if *self.answering.get_mut() == RETRACTED {
            self.replace(&[]);
        }
        while self.written < self.buf.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
            *self.sent.get_mut() = true;
        }
        self.buf = Vec::new();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if *this.answering.get_mut() != GATEWAY {
            this.replace(data);
            if *this.answering.get_mut() == REPLACED {
                return Poll::Ready(Ok(data.len()));
            }
        }
        if this.buf.len() + data.len() > CAPACITY {
            ready!(this.poll_write_out(cx))?;
        }
        if data.len() >= CAPACITY {
            *this.sent.get_mut() = true;
            return Pin::new(&mut this.inner).poll_write(cx, data);
        }
        if this.buf.capacity() == 0 {
            this.buf.reserve_exact(CAPACITY);
        }
        this.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if *self.holding.get_mut() && *self.answering.get_mut() != RETRACTED {
            return Poll::Ready(Ok(()));
        }
        ready!(self.poll_write_out(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_write_out(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl AsyncRead for ClientStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let Some(heads) = &mut this.heads else {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        };
        let start = buf.filled().len();
        // Held bytes are a request waiting: a zero-length read (the keep-alive loop's) is ready.
        if heads.waiting() {
            heads.deliver(buf);
            request_line::check(this.line.get_mut(), &buf.filled()[start..]);
            return Poll::Ready(Ok(()));
        }
        if buf.remaining() == 0 {
            // The keep-alive loop's wait for the next request. What arrives is read into room
            // that exists only during this call, and held for the request's reads: a waiting
            // connection keeps no read buffer (the listeners' transports have none). Passed down
            // instead, the zero-length read would wait for readiness too, but then cost a
            // `recv` of zero bytes, a third system call a GET (strace: 3 `recvfrom` a GET
            // against 2).
            let mut room = [MaybeUninit::<u8>::uninit(); WAIT_READ];
            let mut arrived = ReadBuf::uninit(&mut room);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut arrived))?;
            heads.hold(arrived.filled());
            return Poll::Ready(Ok(()));
        }
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        heads.after_read(buf, start);
        request_line::check(this.line.get_mut(), &buf.filled()[start..]);
        Poll::Ready(Ok(()))
    }
}

#[async_trait]
impl Shutdown for ClientStream {
    async fn shutdown(&mut self) {
        // As pingora's transports do: a failure to say goodbye is not worth reporting.
        if self.flush().await.is_ok() {
            Shutdown::shutdown(&mut *self.inner).await;
        }
    }
}

impl UniqueID for ClientStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for ClientStream {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for ClientStream {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for ClientStream {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest);
    }
}

impl GetSocketDigest for ClientStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest);
    }
}

#[async_trait]
impl Peek for ClientStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, duplex};

    use super::*;

    fn buffered() -> (ClientStream, DuplexStream) {
        let (ours, theirs) = duplex(64 * 1024);
        let stream = ClientStream {
            inner: Box::new(ours),
            buf: Vec::new(),
            written: 0,
            heads: None,
            answering: AtomicU8::new(GATEWAY),
            sent: AtomicBool::new(false),
            retraction: ArcSwapOption::empty(),
            holding: AtomicBool::new(false),
            line: AtomicU8::new(request_line::VALID),
        };
        (stream, theirs)
    }

    /// As [`buffered`], with its reads cut at request heads, as on an HTTP/1 connection.
    fn reading() -> (ClientStream, DuplexStream) {
        let (mut stream, peer) = buffered();
        stream.heads = Some(Heads::default());
        (stream, peer)
    }

    /// What the peer has received so far, without waiting for more.
    async fn received(peer: &mut DuplexStream) -> Vec<u8> {
        let mut got = vec![0; 64 * 1024];
        match tokio::time::timeout(Duration::from_millis(50), peer.read(&mut got)).await {
            Ok(n) => got.truncate(n.unwrap()),
            Err(_) => got.clear(),
        }
        got
    }

    #[tokio::test]
    async fn the_wait_for_a_request_holds_what_arrives_for_the_requests_reads() {
        /// Whether the wait for a request is still waiting after a while.
        async fn waits(stream: &mut ClientStream) -> bool {
            let wait = stream.read(&mut []);
            tokio::time::timeout(Duration::from_millis(50), wait)
                .await
                .is_err()
        }
        let (mut stream, mut peer) = reading();
        // Nothing has arrived: the wait waits (and, given up, loses nothing).
        assert!(waits(&mut stream).await);
        peer.write_all(b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(stream.read(&mut []).await.unwrap(), 0);
        // What the wait read is the requests' reads, a head at a time.
        let mut head = [0; 64];
        let n = stream.read(&mut head).await.unwrap();
        assert_eq!(&head[..n], b"GET /a HTTP/1.1\r\n\r\n");
        assert_eq!(stream.read(&mut []).await.unwrap(), 0);
        let n = stream.read(&mut head).await.unwrap();
        assert_eq!(&head[..n], b"GET /b HTTP/1.1\r\n\r\n");
        // All of it taken: the next wait waits for the client again.
        assert!(waits(&mut stream).await);
        peer.write_all(b"GET /c HTTP/1.1\r\n\r\n").await.unwrap();
        assert_eq!(stream.read(&mut []).await.unwrap(), 0);
        let n = stream.read(&mut head).await.unwrap();
        assert_eq!(&head[..n], b"GET /c HTTP/1.1\r\n\r\n");
    }

    #[tokio::test]
    async fn each_request_line_is_checked_in_the_bytes_the_client_sent() {
        /// The next request head read on `stream`, and whether its line failed the check.
        async fn next_head(stream: &mut Stream) -> (String, bool) {
            ClientStream::expect_request(stream);
            let mut head = [0; 64];
            let n = stream.read(&mut head).await.unwrap();
            let head = String::from_utf8_lossy(&head[..n]).into_owned();
            (head, ClientStream::request_line_invalid(stream))
        }
        let (stream, mut peer) = reading();
        let mut stream: Stream = Box::new(stream);
        let post = "POST /a HTTP/1.1\r\nContent-Length: 6\r\n\r\n";
        peer.write_all(post.as_bytes()).await.unwrap();
        assert_eq!(next_head(&mut stream).await, (post.to_owned(), false));
        // A body is not a request line, whatever its bytes.
        peer.write_all(b"a b\x01\r\n").await.unwrap();
        stream.read_exact(&mut [0; 6]).await.unwrap();
        assert!(!ClientStream::request_line_invalid(&stream));
        // Two requests in one read: each line is checked on its own.
        peer.write_all(b"GET /a b HTTP/1.1\r\n\r\nGET /c HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let invalid = "GET /a b HTTP/1.1\r\n\r\n".to_owned();
        assert_eq!(next_head(&mut stream).await, (invalid, true));
        let valid = "GET /c HTTP/1.1\r\n\r\n".to_owned();
        assert_eq!(next_head(&mut stream).await, (valid, false));
    }

    #[tokio::test]
    async fn a_response_leaves_whole_at_its_flush_and_the_buffer_goes_with_it() {
        let (mut stream, mut peer) = buffered();
        stream.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        stream.write_all(b"[]").await.unwrap();
        assert_eq!(received(&mut peer).await, b"");
        assert_eq!(stream.buf.capacity(), CAPACITY);

        stream.flush().await.unwrap();
        assert_eq!(received(&mut peer).await, b"HTTP/1.1 200 OK\r\n\r\n[]");
        assert_eq!(
            stream.buf.capacity(),
            0,
            "an idle connection holds no buffer"
        );
    }

    #[tokio::test]
    async fn a_large_write_goes_straight_through_after_what_was_gathered() {
        let (mut stream, mut peer) = buffered();
        let body = vec![b'x'; CAPACITY + 1];
        stream.write_all(b"head").await.unwrap();
        stream.write_all(&body).await.unwrap();
        stream.write_all(b"tail").await.unwrap();
        stream.flush().await.unwrap();

        let mut got = Vec::new();
        while got.len() < 4 + body.len() + 4 {
            got.extend(received(&mut peer).await);
        }
        assert_eq!(&got[..4], b"head");
        assert_eq!(&got[4..4 + body.len()], &body[..]);
        assert_eq!(&got[4 + body.len()..], b"tail");
    }

    #[tokio::test]
    async fn pingora_refusals_are_replaced_until_the_proxy_has_the_request() {
        let (mut stream, mut peer) = buffered();
        *stream.answering.get_mut() = PINGORA;
        stream
            .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            .await
            .unwrap();
        stream.flush().await.unwrap();
        let got = String::from_utf8(received(&mut peer).await).unwrap();
        assert!(got.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{got}");
        assert!(got.ends_with(r#""code":"invalid_request","message":"the request is not valid HTTP/1.1: its request line or a header cannot be parsed, its Host is given twice or differs from the host in its target, or its headers are too large","status":400}"#), "{got}");

        // Once the proxy has the request, its 400 is its own.
        let (mut stream, mut peer) = buffered();
        *stream.answering.get_mut() = PINGORA;
        let own = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\n{}";
        let boxed: Stream = Box::new(stream);
        ClientStream::mark_answering(&boxed);
        let mut stream = boxed;
        stream.write_all(own).await.unwrap();
        stream.flush().await.unwrap();
        assert_eq!(received(&mut peer).await, own);
    }

    #[tokio::test]
    async fn a_response_is_taken_back_until_some_of_it_has_left() {
        let (mut stream, mut peer) = buffered();
        stream.heads = Some(Heads::default());
        let mut stream: Stream = Box::new(stream);
        stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n")
            .await
            .unwrap();
        stream.write_all(b"[1,").await.unwrap();
        assert!(ClientStream::retract(
            &stream,
            b"HTTP/1.1 502 Bad Gateway\r\n\r\n".to_vec()
        ));
        // What pingora writes after it is dropped.
        stream.write_all(b"2]").await.unwrap();
        Shutdown::shutdown(&mut *stream).await;
        assert_eq!(
            received(&mut peer).await,
            b"HTTP/1.1 502 Bad Gateway\r\n\r\n"
        );

        let (mut stream, mut peer) = buffered();
        stream.heads = Some(Heads::default());
        let mut stream: Stream = Box::new(stream);
        stream.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        stream.flush().await.unwrap();
        assert!(!ClientStream::retract(
            &stream,
            b"HTTP/1.1 502 Bad Gateway\r\n\r\n".to_vec()
        ));
        stream.write_all(b"[]").await.unwrap();
        stream.flush().await.unwrap();
        assert_eq!(received(&mut peer).await, b"HTTP/1.1 200 OK\r\n\r\n[]");
        // The next request's response can be taken back again.
        ClientStream::mark_answering(&stream);
        assert!(ClientStream::unsent(&stream));
    }

    #[tokio::test]
    async fn shutting_down_writes_what_is_gathered_first() {
        let (mut stream, mut peer) = buffered();
        stream.write_all(b"last words").await.unwrap();
        Shutdown::shutdown(&mut stream).await;
        assert_eq!(received(&mut peer).await, b"last words");
    }
}
