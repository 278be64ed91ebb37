//! The admin listener: `/metrics` (Prometheus text), `/healthz` (the process runs) and
//! `/readyz` (keys are loaded and the gateway is not shutting down). Never on the public port.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

use crate::metrics;

/// The admin HTTP app.
pub struct Admin {
    /// Set when shutdown begins, so load balancers stop sending traffic.
    pub stopping: Arc<AtomicBool>,
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let (status, content_type, body) = match session.req_header().uri.path() {
            "/metrics" => (200, "text/plain; version=0.0.4", metrics::render()),
            "/healthz" => (200, "application/json", br#"{"status":"ok"}"#.to_vec()),
            "/readyz" if self.stopping.load(Ordering::Relaxed) => {
                (503, "application/json", br#"{"status":"stopping"}"#.to_vec())
            }
            "/readyz" => (200, "application/json", br#"{"status":"ready"}"#.to_vec()),
            _ => (404, "application/json", br#"{"code":"not_found","message":"admin paths are /metrics, /healthz and /readyz","status":404}"#.to_vec()),
        };
        Response::builder()
            .status(status)
            .header("Content-Type", content_type)
            .header("Content-Length", body.len())
            .body(body)
            .expect("static parts are valid")
    }
}
