//! Client connections over plain HTTP/1.1, held cheaply between requests and bounded in time.
//!
//! pingora drives a keep-alive connection by awaiting the next request inside the whole
//! per-request proxy state machine, with the previous request's session and buffers: about
//! 100 KB per idle connection, for as long as the client keeps it open. [`Connections`] owns
//! the keep-alive loop instead. Between requests a connection is only its socket: it waits for
//! the first byte of the next request (at most `gateway.keepalive_timeout_seconds`), and only
//! then builds a session and hands it to the proxy. Once that byte is in, the rest of the
//! request head must follow within `gateway.header_timeout_seconds` (nginx's
//! `client_header_timeout`), or the connection is closed: a slow client cannot hold a session
//! open by trickling its header.
//!
//! TLS connections (HTTP/2 or HTTP/1.1 chosen by ALPN) keep pingora's own loop: a TLS stream
//! cannot be peeked, and HTTP/2 multiplexes its requests anyway.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream, ServerApp};
use pingora::protocols::Stream;
use pingora::protocols::http::ServerSession;
use pingora::server::ShutdownWatch;

use crate::config::Settings;
use crate::metrics;

tokio::task_local! {
    /// Set by the proxy once it has a request head: from then on the header timeout is off.
    static HEAD_READ: Arc<AtomicBool>;
}

/// Tells the connection this request runs on that its head has been read (called by the
/// proxy's first hook; a no-op outside [`Connections`], e.g. over TLS).
pub fn head_read() {
    let _ = HEAD_READ.try_with(|flag| flag.store(true, Ordering::Relaxed));
}

/// The public listener's application: `app` (the proxy) per request, the keep-alive loop here.
pub struct Connections<A> {
    app: Arc<A>,
    live: Arc<ArcSwap<Settings>>,
}

impl<A> Connections<A> {
    /// Serves connections with `app`, timed by the settings in force in `live`.
    pub fn new(app: A, live: Arc<ArcSwap<Settings>>) -> Connections<A> {
        Connections {
            app: Arc::new(app),
            live,
        }
    }

    /// The proxy, to configure before the service starts.
    pub fn app_mut(&mut self) -> Option<&mut A> {
        Arc::get_mut(&mut self.app)
    }
}

/// Why a connection's loop ended without another request.
enum Idle {
    /// The client sent the first byte of a request.
    Request,
    /// The client closed, the idle timeout passed, or the gateway is shutting down.
    Close,
}

/// Waits, holding nothing but `stream`, until the client sends a byte, closes, stays silent
/// for `timeout`, or the gateway starts shutting down.
async fn await_request(stream: &mut Stream, timeout: Duration, shutdown: &ShutdownWatch) -> Idle {
    let mut byte = [0u8; 1];
    let mut shutdown = shutdown.clone();
    tokio::select! {
        biased;
        peeked = tokio::time::timeout(timeout, stream.try_peek(&mut byte)) => match peeked {
            Ok(Ok(true)) => Idle::Request,
            Ok(_) => Idle::Close,
            Err(_) => {
                metrics::CLIENT_TIMEOUTS.with_label_values(&["idle"]).inc();
                Idle::Close
            }
        },
        _ = shutdown.wait_for(|stopping| *stopping) => Idle::Close,
    }
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
        if stream.get_ssl_digest().is_some() {
            return ServerApp::process_new(&self.app, stream, shutdown).await;
        }
        // pingora's task for a connection is sized for a TLS handshake (about 8 KB) and lives as
        // long as the connection; a task of our own holds the connection in a few hundred bytes.
        tokio::spawn(self.clone().serve(stream, shutdown.clone()));
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
    /// The keep-alive loop of one plain-HTTP connection. Between requests its task holds the
    /// stream and this loop's few hundred bytes; a request's state is boxed and freed with it.
    async fn serve(self: Arc<Self>, mut stream: Stream, shutdown: ShutdownWatch) {
        let _open = metrics::OpenConnection::open();
        let head = Arc::new(AtomicBool::new(false));
        let mut persisted: Option<HttpPersistentSettings> = None;
        loop {
            // A connection that has sent nothing yet is as cheap as an idle one, so the first
            // request gets the keep-alive timeout too.
            let idle = self.live.load().keepalive_timeout;
            if let Idle::Close = await_request(&mut stream, idle, &shutdown).await {
                return;
            }
            let request = Box::pin(self.request(stream, persisted, &shutdown, &head));
            match request.await {
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
        head: &Arc<AtomicBool>,
    ) -> Option<ReusedHttpStream> {
        let settings = self.live.load_full();
        let mut session = ServerSession::new_http1(stream);
        match persisted {
            Some(persisted) => persisted.apply_to_session(&mut session),
            None => session.set_keepalive(Some(settings.keepalive_timeout.as_secs())),
        }
        if *shutdown.borrow() {
            session.set_keepalive(None);
        }
        head.store(false, Ordering::Relaxed);
        let request = HEAD_READ.scope(head.clone(), self.app.process_new_http(session, shutdown));
        tokio::pin!(request);
        tokio::select! {
            biased;
            reused = &mut request => reused,
            _ = tokio::time::sleep(settings.header_timeout) => {
                if head.load(Ordering::Relaxed) {
                    request.await
                } else {
                    metrics::CLIENT_TIMEOUTS.with_label_values(&["header"]).inc();
                    None
                }
            }
        }
    }
}
