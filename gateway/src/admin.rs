//! The admin listener: `/metrics` (Prometheus text), `/healthz` (the process runs) and
//! `/readyz` (not shutting down, and every route has a healthy instance). Never on the public
//! port.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

use crate::metrics;

/// The admin HTTP app.
pub struct Admin {
    /// Set when shutdown begins, so load balancers stop sending traffic.
    pub stopping: Arc<AtomicBool>,
    /// The configuration in force: its routes' health decides readiness.
    pub live: Arc<ArcSwap<crate::Settings>>,
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
            "/readyz" => match self.unhealthy_route() {
                Some(route) => (
                    503,
                    "application/json",
                    serde_json::json!({"status": "unready", "route_without_healthy_instance": route})
                        .to_string()
                        .into_bytes(),
                ),
                None => (200, "application/json", br#"{"status":"ready"}"#.to_vec()),
            },
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
