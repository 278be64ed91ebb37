//! The admin listener: `/metrics` (Prometheus text), `/healthz` (the process runs) and
//! `/readyz` (not shutting down, keys loaded, and every route has a healthy instance). Never on
//! the public port.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;

use animal_store_contract::{ErrorBody, ErrorCode, JSON_CONTENT_TYPE};
use async_trait::async_trait;
use pingora::ErrorType;
use pingora::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream};
use pingora::http::ResponseHeader;
use pingora::protocols::http::ServerSession;
use pingora::server::ShutdownWatch;

use crate::keyring::Keyring;
use crate::{connections, errors, metrics};

/// The admin HTTP app.
pub struct Admin {
    /// Set when shutdown begins, so load balancers stop sending traffic.
    pub stopping: Arc<AtomicBool>,
    /// The configuration in force: its routes' health decides readiness.
    pub live: Arc<ArcSwap<crate::Settings>>,
    /// The keys: not ready until some were read ([`Keyring::loaded`]).
    pub keys: Arc<Keyring>,
}

impl Admin {
    /// The first route with no healthy instance, if any.
    fn unhealthy_route(&self) -> Option<String> {
        self.live
            .load()
            .routes
            .iter()
            .find(|r| r.upstream.healthy() == 0)
            .map(|r| r.prefix.clone())
    }

    /// The answer to a `method` request for `path`: status, content type and body, and the
    /// methods allowed when the method is not one of them. The three paths are read, never
    /// written: any other method gets `405` with `Allow: GET, HEAD`, as the public port's read-only
    /// resources do, rather than a `200` that tells a mistaken `POST /metrics` it worked.
    fn answer(&self, method: &http::Method, path: &str) -> Answer {
        let known = matches!(path, "/metrics" | "/healthz" | "/readyz");
        if known && method != http::Method::GET && method != http::Method::HEAD {
            let message = format!("{path} is read with GET or HEAD");
            return Answer::error(ErrorCode::MethodNotAllowed, &message).allowing("GET, HEAD");
        }
        match path {
            "/metrics" => Answer::ok(200, "text/plain; version=0.0.4", metrics::render()),
            "/healthz" => Answer::ok(200, "application/json", br#"{"status":"ok"}"#.to_vec()),
            "/readyz" if self.stopping.load(Ordering::Relaxed) => {
                Answer::ok(503, "application/json", br#"{"status":"stopping"}"#.to_vec())
            }
            "/readyz" if !self.keys.loaded() => Answer::ok(
                503,
                "application/json",
                br#"{"status":"unready","key_store":"not loaded"}"#.to_vec(),
            ),
            "/readyz" => match self.unhealthy_route() {
                Some(route) => Answer::ok(
                    503,
                    "application/json",
                    serde_json::json!({"status": "unready", "route_without_healthy_instance": route})
                        .to_string()
                        .into_bytes(),
                ),
                None => Answer::ok(200, "application/json", br#"{"status":"ready"}"#.to_vec()),
            },
            _ => Answer::error(
                ErrorCode::NotFound,
                "admin paths are /metrics, /healthz and /readyz",
            ),
        }
    }
}

/// What the admin listener sends for one request.
struct Answer {
    status: u16,
    content_type: &'static str,
    body: Vec<u8>,
    /// `Allow`, for a `405`.
    allow: Option<&'static str>,
}

impl Answer {
    fn ok(status: u16, content_type: &'static str, body: Vec<u8>) -> Self {
        Self {
            status,
            content_type,
            body,
            allow: None,
        }
    }

    /// The contract's error body, with the code's status.
    fn error(code: ErrorCode, message: &str) -> Self {
        let body = ErrorBody::new(code, message).to_json();
        Self::ok(code.status(), JSON_CONTENT_TYPE, body)
    }

    fn allowing(self, methods: &'static str) -> Self {
        Self {
            allow: Some(methods),
            ..self
        }
    }

    /// The response head: the status, `Content-Type`, `Content-Length` and any `Allow`.
    fn head(&self) -> ResponseHeader {
        let mut head = head(self.status, self.content_type, self.body.len());
        if let Some(methods) = self.allow {
            head.insert_header("Allow", methods)
                .expect("the admin's Allow values are valid");
        }
        head
    }
}

/// A response head with the admin's two headers.
fn head(status: u16, content_type: &str, length: usize) -> ResponseHeader {
    let mut head = ResponseHeader::build(status, Some(2)).expect("the admin's statuses are valid");
    head.insert_header("Content-Type", content_type)
        .and_then(|()| head.insert_header("Content-Length", length))
        .expect("the admin's headers are valid");
    head
}

/// pingora's app for a `ServeHttp` (`pingora::apps::http_app`), with one difference: a request
/// pingora cannot parse gets the contract's `400` before the connection closes, where pingora's
/// app closes it with nothing said. Its connections come through
/// [`Connections`](crate::connections::Connections) for [`Port::Admin`](crate::connections::Port):
/// reads cut at request heads (pingora's own keep-alive loop drops requests pipelined behind
/// the first), the public port's keep-alive and header timeouts, and no keep-alive once shutdown
/// has begun.
#[async_trait]
impl HttpServerApp for Admin {
    async fn process_new_http(
        self: &Arc<Self>,
        mut http: ServerSession,
        _shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        match http.read_request().await {
            Ok(true) => connections::request_head_read(http.stream()),
            Ok(false) => return None,
            Err(e) if matches!(e.etype, ErrorType::InvalidHTTPHeader) => {
                // The contract's error, where pingora's own app closes with nothing said.
                let body = errors::unparsable().body();
                let head = head(400, JSON_CONTENT_TYPE, body.len());
                if let Err(e) = http.write_error_response(head, body.into()).await {
                    log::debug!("admin listener: the 400 could not be written: {e}");
                }
                return None;
            }
            Err(e) => {
                log::debug!("admin listener: the connection failed before a request: {e}");
                return None;
            }
        }
        let request = http.req_header();
        let answer = self.answer(&request.method, request.uri.path());
        let written = match http.write_response_header(Box::new(answer.head())).await {
            Ok(()) => http.write_response_body(answer.body.into(), true).await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            log::debug!("admin listener: the response could not be written: {e}");
            return None;
        }
        let persistent = HttpPersistentSettings::for_session(&http);
        match http.finish().await {
            Ok(stream) => stream.map(|s| ReusedHttpStream::from_reusable_stream(s, persistent)),
            Err(e) => {
                log::debug!("admin listener: the request could not be finished: {e}");
                None
            }
        }
    }
}
