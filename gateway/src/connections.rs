//! Client connections over HTTP/1.1, plain or TLS, held cheaply between requests and bounded in
//! time.
//!
//! pingora drives a keep-alive connection by awaiting the next request inside the whole
//! per-request proxy state machine, with the previous request's session and buffers: about
//! 100 KB per idle connection, for as long as the client keeps it open. [`Connections`] owns
//! the keep-alive loop instead. Between requests a connection is only its socket and a 430-byte
//! task (read and write buffers exist only while a request is read and a response written,
//! [`crate::client_stream`]): it waits until the client sends the next request (at most
//! `gateway.keepalive_timeout_seconds`), and only then builds a session and hands it to the
//! proxy. The request head must then be complete within `gateway.header_timeout_seconds`
//! (nginx's `client_header_timeout`), or the connection is closed: a slow client cannot hold a
//! session open by trickling its header.
//!
//! HTTP/2 connections (chosen by ALPN over TLS) keep pingora's own loop: HTTP/2 multiplexes its
//! requests and has its own idle timeout (`h2_idle_timeout`, set to the same keep-alive).
//!
//! The admin listener's connections go through the same loop and timeouts ([`Port::Admin`]),
//! but they stay out of the API's metrics.

use std::cell::Cell;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream, ServerApp};
use pingora::protocols::http::ServerSession;
use pingora::protocols::{ALPN, Stream};
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::client_stream::ClientStream;
use crate::errors::EarlyRefusals;
use crate::metrics;
use crate::settings::Settings;

thread_local! {
    /// Set by the proxy when it has a request head, during the poll that read it.
    static HEAD_READ: Cell<bool> = const { Cell::new(false) };
}

/// The app has the request on `stream` (the proxy's first hook's call, the admin's once it has
/// read the head; in the poll that read it): the connection's loop stops timing the head, and
/// an answer on the stream is the gateway's own ([`ClientStream::mark_answering`]). Harmless
/// where nothing watches, e.g. on HTTP/2, which has no stream of its own here.
pub fn request_head_read(stream: Option<&Stream>) {
    HEAD_READ.set(true);
    if let Some(stream) = stream {
        ClientStream::mark_answering(stream);
    }
}

/// Polls `request` until it finishes (`Some`) or has read its request head (`None`).
async fn until_head<F: Future + Unpin>(request: &mut F) -> Option<F::Output> {
    poll_fn(|cx| {
        HEAD_READ.set(false);
        match Pin::new(&mut *request).poll(cx) {
            Poll::Ready(done) => Poll::Ready(Some(done)),
            Poll::Pending if HEAD_READ.get() => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// The port a [`Connections`] serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// The API's: its connections and their timeouts are counted in the client metrics, and
    /// pingora's own refusals on it are replaced by the contract's errors.
    Public,
    /// The operators': the same timeouts, but counted nowhere, so scraping `/metrics` does not
    /// show up in what it reads; its app answers unparsable requests itself. Its idle
    /// connections stay open when shutdown begins, for `/readyz` to say so.
    Admin,
}

/// A listener's application: `app` per request (the proxy, or the admin's), the keep-alive loop
/// here.
pub struct Connections<A> {
    app: Arc<A>,
    live: Arc<ArcSwap<Settings>>,
    port: Port,
    /// On the public port, how pingora's own refusals are answered instead.
    refusals: Option<Arc<EarlyRefusals>>,
}

impl<A> Connections<A> {
    /// Serves connections to `port` with `app`, timed by the settings in force in `live`.
    pub fn new(app: A, live: Arc<ArcSwap<Settings>>, port: Port) -> Connections<A> {
        Connections {
            app: Arc::new(app),
            live,
            port,
            refusals: None,
        }
    }

    /// The same, answering the requests pingora refuses before `app` sees them with
    /// `refusals` (on the public port).
    pub fn with_refusals(mut self, refusals: Arc<EarlyRefusals>) -> Connections<A> {
        self.refusals = Some(refusals);
        self
    }

    /// The proxy, to configure before the service starts.
    pub fn app_mut(&mut self) -> Option<&mut A> {
        Arc::get_mut(&mut self.app)
    }
}

/// Why a connection's loop ended without another request.
enum Idle {
    /// Bytes of a request have arrived (or the client closed: the session finds out).
    Request,
    /// The idle timeout passed.
    TimedOut,
    /// The connection failed, or the gateway is shutting down.
    Close,
}

/// A connection's waits for something other than its client: its alarm and its wait for
/// shutdown ([`Connections::serve`]), which live as long as the connection.
struct Waits<'a, S> {
    /// The connection's one timer, armed once per connection rather than once per request
    /// (registering a timer was half of a wait's cost): it may be set to go off earlier than a
    /// wait's end, as an earlier wait set it; it then goes off early once, and is set again for
    /// this wait's end. A connection busy for good sets it once per timeout.
    alarm: Pin<&'a mut Sleep>,
    /// Whether the alarm has been polled since it was last set, so that it wakes the task.
    alarm_armed: bool,
    /// Ends when the gateway starts shutting down (never, on the admin port).
    stopping: Pin<&'a mut S>,
    /// Whether `stopping` has been polled, so that a shutdown wakes the task.
    stopping_armed: bool,
    /// The shutdown's watch, read to know whether `stopping` may have ended.
    shutdown: &'a ShutdownWatch,
}

/// Waits, holding nothing but `stream`, until the client sends something, stays silent for
/// `timeout`, or the gateway starts shutting down.
///
/// The alarm and the wait for shutdown are polled only when they may have ended or are not yet
/// set to wake this task: once polled, each wakes the task when it ends, as the task's waker
/// does not change. Polled at every wait, they cost 800 instructions a GET under callgrind
/// (the watch's list of waiters locked, the timer's state checked: 81,613 against 80,812); now
/// a wait that the client ends costs its read and two loads.
///
/// A zero-length read waits for bytes and leaves them where the session that follows parses the
/// request from, with no extra system call: [`ClientStream`] reads them and holds them for the
/// session's reads, so a waiting connection holds no read buffer.
async fn await_request<S: Future<Output = ()>>(
    stream: &mut Stream,
    timeout: Duration,
    waits: &mut Waits<'_, S>,
) -> Idle {
    let ends = Instant::now() + timeout;
    if waits.alarm.deadline() > ends {
        // The timeout was shortened by a reload since the alarm was set.
        waits.alarm.as_mut().reset(ends);
        waits.alarm_armed = false;
    }
    poll_fn(|cx| {
        let mut nothing = ReadBuf::new(&mut []);
        if let Poll::Ready(read) = Pin::new(&mut *stream).poll_read(cx, &mut nothing) {
            return Poll::Ready(match read {
                Ok(()) => Idle::Request,
                Err(_) => Idle::Close,
            });
        }
        while !waits.alarm_armed || waits.alarm.is_elapsed() {
            match waits.alarm.as_mut().poll(cx) {
                Poll::Ready(()) if waits.alarm.deadline() >= ends => {
                    return Poll::Ready(Idle::TimedOut);
                }
                Poll::Ready(()) => {
                    waits.alarm.as_mut().reset(ends);
                    waits.alarm_armed = false;
                }
                Poll::Pending => waits.alarm_armed = true,
            }
        }
        // A watch whose sender is gone has changed for good.
        if !waits.stopping_armed || waits.shutdown.has_changed().unwrap_or(true) {
            if waits.stopping.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Idle::Close);
            }
            waits.stopping_armed = true;
        }
        Poll::Pending
    })
    .await
}

#[async_trait]
impl<A> ServerApp for Connections<A>
where
    A: HttpServerApp + Send + Sync + 'static,
{
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        // The listeners leave writes unbuffered; responses are gathered here instead.
        let stream = ClientStream::wrap(stream, self.refusals.clone());
        // pingora's task for a connection is sized for a TLS handshake (about 8 KB) and lives as
        // long as the connection; a task of our own holds the connection in a few hundred bytes.
        if matches!(stream.selected_alpn_proto(), None | Some(ALPN::H1)) {
            tokio::spawn(self.clone().serve(stream, shutdown.clone()));
        } else {
            let (app, shutdown) = (self.app.clone(), shutdown.clone());
            tokio::spawn(async move { ServerApp::process_new(&app, stream, &shutdown).await });
        }
        None
    }

    async fn cleanup(&self) {
        ServerApp::cleanup(&*self.app).await;
    }
}

impl<A> Connections<A>
where
    A: HttpServerApp + Send + Sync + 'static,
{
    /// The keep-alive loop of one HTTP/1.1 connection. Between requests its task holds the
    /// stream and this loop's few hundred bytes; a request's state (boxed by pingora) is freed
    /// with it.
    async fn serve(self: Arc<Self>, mut stream: Stream, shutdown: ShutdownWatch) {
        let _open = (self.port == Port::Public).then(metrics::OpenConnection::open);
        let mut persisted: Option<HttpPersistentSettings> = None;
        let alarm = tokio::time::sleep(self.live.load().keepalive_timeout);
        tokio::pin!(alarm);
        // The connection's wait for shutdown, made once and polled by every wait between
        // requests (a wait made anew each time joined the watch's list of waiters and left it
        // again every request). The admin port keeps its connections through the grace period:
        // a prober that keeps one open reads `/readyz`'s 503 (and then the connection closes).
        let mut watch = (self.port == Port::Public).then(|| shutdown.clone());
        let stopping = async move {
            match &mut watch {
                Some(watch) => drop(watch.wait_for(|stopping| *stopping).await),
                None => std::future::pending().await,
            }
        };
        tokio::pin!(stopping);
        let mut waits = Waits {
            alarm: alarm.as_mut(),
            alarm_armed: false,
            stopping: stopping.as_mut(),
            stopping_armed: false,
            shutdown: &shutdown,
        };
        loop {
            // A connection that has sent nothing yet is as cheap as an idle one, so the first
            // request gets the keep-alive timeout too. Pipelined requests are waiting in the
            // stream's reads ([`crate::pipeline`]): they end the wait at once.
            let idle = self.live.load().keepalive_timeout;
            match await_request(&mut stream, idle, &mut waits).await {
                Idle::Request => {}
                Idle::TimedOut => return self.count_timeout("idle"),
                Idle::Close => return,
            }
            // Boxed: a request's state is twice the size of this loop's.
            match Box::pin(self.request(stream, persisted, &shutdown)).await {
                Some(reused) => (stream, persisted) = reused.consume(),
                None => return,
            }
        }
    }

    /// One request on `stream`, whose first byte is in: its head must be complete within the
    /// header timeout.
    async fn request(
        &self,
        stream: Stream,
        persisted: Option<HttpPersistentSettings>,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        let (keepalive, header_timeout) = {
            let settings = self.live.load();
            (settings.keepalive_timeout, settings.header_timeout)
        };
        // Until the proxy has the request, an answer on the stream is pingora's own refusal (the
        // admin's app answers the requests it cannot parse itself).
        if self.port == Port::Public {
            ClientStream::expect_request(&stream);
        }
        // The session (680 bytes) is handed to the proxy within this block: a local still in
        // scope at an `await` keeps its room in the future's state even once moved out, and this
        // future is boxed and moved every request.
        let mut request = {
            let mut session = ServerSession::new_http1(stream);
            match persisted {
                Some(persisted) => persisted.apply_to_session(&mut session),
                None => {
                    session.set_keepalive(Some(keepalive.as_secs()));
                    // While proxying, pingora reads one byte to see whether the client has gone;
                    // of a pipelined request, that byte is kept for the next request on the
                    // connection instead of failing this one (the setting carries over).
                    session.set_pipelining_enabled(true);
                }
            }
            if *shutdown.borrow() {
                session.set_keepalive(None);
            }
            self.app.process_new_http(session, shutdown)
        };
        // Nearly every head arrives whole and is read by the first poll: the header timeout is
        // made only if it is not (making one reads the clock).
        let read = {
            let head = until_head(&mut request);
            tokio::pin!(head);
            match poll_fn(|cx| Poll::Ready(head.as_mut().poll(cx))).await {
                Poll::Ready(read) => Ok(read),
                Poll::Pending => pingora_timeout::timeout(header_timeout, head).await,
            }
        };
        match read {
            Ok(Some(done)) => done,
            Ok(None) => request.await,
            Err(_) => {
                self.count_timeout("header");
                None
            }
        }
    }

    /// Counts a connection closed by the timeout of `phase`, on the public port.
    fn count_timeout(&self, phase: &str) {
        if self.port == Port::Public {
            metrics::CLIENT_TIMEOUTS.with_label_values(&[phase]).inc();
        }
    }
}
