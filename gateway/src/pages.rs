//! Answers the gateway gives itself, without an upstream: the API's public pages
//! (`/v1/openapi.yaml`, `/v1/docs` and its script), CORS preflights, and `GET /v1/rate_limit`.
//! Each goes out through [`crate::errors::send`], so it carries the same headers as any other
//! response of the public listener.

use std::sync::Arc;

use animal_store_contract::{
    DOCS_HTML, DOCS_PATH, OPENAPI_PATH, OPENAPI_YAML, REDOC_JS, REDOC_PATH,
};
use bytes::Bytes;
use http::Method;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora_proxy::Session;

use crate::context::Ctx;
use crate::cors::{Cors, CorsPolicy};
use crate::errors::send;
use crate::key_set::ActiveKey;
use crate::limits::{Quota, ceil_secs};

/// A page anyone may read: no key, nothing counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    /// The OpenAPI description.
    OpenApi,
    /// The HTML reference.
    Docs,
    /// Redoc's bundle, which renders the reference.
    Redoc,
    /// `/v1/docs/`, as people type it: a redirect to the reference, not a 401 asking for a key.
    DocsWithSlash,
}

/// The public page `request` asks for, if any (GET or HEAD on its exact path; pingora leaves
/// out the body of an answer to HEAD).
pub fn public_page(request: &RequestHeader) -> Option<Page> {
    if request.method != Method::GET && request.method != Method::HEAD {
        return None;
    }
    match request.uri.path() {
        OPENAPI_PATH => Some(Page::OpenApi),
        DOCS_PATH => Some(Page::Docs),
        REDOC_PATH => Some(Page::Redoc),
        path if path.strip_suffix('/') == Some(DOCS_PATH) => Some(Page::DocsWithSlash),
        _ => None,
    }
}

/// Sends `page`.
pub async fn serve(session: &mut Session, ctx: &mut Ctx, page: Page) -> pingora::Result<()> {
    let (content_type, body) = match page {
        Page::OpenApi => (
            "application/yaml",
            Bytes::from_static(OPENAPI_YAML.as_bytes()),
        ),
        Page::Docs => (
            "text/html; charset=utf-8",
            Bytes::from_static(DOCS_HTML.as_bytes()),
        ),
        Page::Redoc => (
            "text/javascript; charset=utf-8",
            Bytes::from_static(REDOC_JS),
        ),
        Page::DocsWithSlash => {
            // Relative, so it stays on the address and listener the client used.
            let mut response = ResponseHeader::build(308, Some(8))?;
            response.insert_header("Location", DOCS_PATH)?;
            let body = Bytes::from_static(b"The API reference is at /v1/docs\n");
            return send(session, ctx, response, "text/plain; charset=utf-8", body).await;
        }
    };
    let mut response = ResponseHeader::build(200, Some(8))?;
    if page == Page::Redoc {
        // The bundle changes only with the binary; a day of caching spares 2 MB per visit.
        response.insert_header("Cache-Control", "public, max-age=86400")?;
    }
    send(session, ctx, response, content_type, body).await
}

/// Answers a preflight: 204, with the policy's headers if the origin is allowed (else none,
/// and the browser refuses the real request).
pub async fn preflight(
    session: &mut Session,
    ctx: &mut Ctx,
    policy: &CorsPolicy,
) -> pingora::Result<()> {
    let mut response = ResponseHeader::build(204, Some(8))?;
    if matches!(ctx.cors, Cors::Allowed(_)) {
        policy.preflight(&mut response)?;
    }
    send(session, ctx, response, "", Bytes::new()).await
}

/// `GET /v1/rate_limit`: the key's plan, both windows and its ban, counting nothing.
pub async fn rate_limit(
    session: &mut Session,
    ctx: &mut Ctx,
    key: &Arc<ActiveKey>,
    minute: Quota,
    day: Quota,
    banned_until_ms: Option<u64>,
) -> pingora::Result<()> {
    let window = |q: Quota| serde_json::json!({"limit": q.limit, "remaining": q.remaining, "reset": ceil_secs(q.reset_ms)});
    let body = serde_json::json!({
        "key_id": key.id.to_string(),
        "plan": key.plan.to_str().unwrap_or_default(),
        "minute": window(minute),
        "day": window(day),
        "banned_until": banned_until_ms.map(ceil_secs),
    });
    let response = ResponseHeader::build(200, Some(8))?;
    let body = Bytes::from(serde_json::to_vec(&body).expect("a JSON value serializes"));
    send(
        session,
        ctx,
        response,
        animal_store_contract::JSON_CONTENT_TYPE,
        body,
    )
    .await
}
