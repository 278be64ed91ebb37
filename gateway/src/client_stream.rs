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
//! and is replaced with the contract's JSON error, with the rate-limit headers of the peer's
//! failed-authentication budget ([`EarlyRefusals::answer`]).
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
use std::net::{IpAddr, Ipv4Addr};
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

use crate::errors::EarlyRefusals;
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
    /// How pingora's own refusals are answered instead (on the public listener).
    refusals: Option<Arc<EarlyRefusals>>,
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
    /// ALPN, or `http/1.1`), cuts its reads at request heads, and answers pingora's own refusals
    /// with `refusals`.
    pub fn wrap(inner: Stream, refusals: Option<Arc<EarlyRefusals>>) -> Stream {
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
            refusals,
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
            let peer = self
                .inner
                .get_socket_digest()
                .and_then(|d| Some(d.peer_addr()?.as_inet()?.ip()))
                .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            let refusal = self.refusals.as_ref().zip(status);
            match refusal.and_then(|(refusals, status)| refusals.answer(status, peer)) {
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
mod tests;
