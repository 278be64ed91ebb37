//! Answers the gateway gives itself, without an upstream: the API's public pages
//! (`/v1/openapi.yaml`, `/v1/docs` and its script), CORS preflights, and `GET /v1/rate_limit`.
//! Each goes out through [`crate::errors::send`], so it carries the same headers as any other
//! response of the public listener.

use std::sync::Arc;

use animal_store_contract::{
    DOCS_HTML, DOCS_PATH, OPENAPI_PATH, OPENAPI_YAML, REDOC_JS, REDOC_JS_GZIP, REDOC_PATH,
};
use bytes::Bytes;
use http::Method;
use http::header::{ACCEPT_ENCODING, IF_NONE_MATCH};
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
        Page::Redoc => return serve_bundle(session, ctx).await,
        Page::DocsWithSlash => {
            // Relative, so it stays on the address and listener the client used.
            let mut response = ResponseHeader::build(308, Some(8))?;
            response.insert_header("Location", DOCS_PATH)?;
            let body = Bytes::from_static(b"The API reference is at /v1/docs\n");
            return send(session, ctx, response, "text/plain; charset=utf-8", body).await;
        }
    };
    let response = ResponseHeader::build(200, Some(8))?;
    send(session, ctx, response, content_type, body).await
}

/// Redoc's bundle, as nginx serves a static file with `gzip_static`: compressed to a client
/// that accepts gzip (0.65 MB in place of 2.3), whole to others, with `Vary: Accept-Encoding`;
/// kept by the client for a day, then revalidated by its entity tag, which a `304` without a
/// body confirms.
async fn serve_bundle(session: &mut Session, ctx: &mut Ctx) -> pingora::Result<()> {
    let request = session.req_header();
    let gzip = accepts_gzip(request);
    let tag = bundle_tag(gzip);
    let current = names_tag(request, &tag);
    let mut response = ResponseHeader::build(if current { 304 } else { 200 }, Some(8))?;
    // The bundle changes only with the binary.
    response.insert_header("Cache-Control", "public, max-age=86400")?;
    response.insert_header("ETag", &tag)?;
    response.insert_header("Vary", "Accept-Encoding")?;
    let body = if current {
        Bytes::new()
    } else if gzip {
        response.insert_header("Content-Encoding", "gzip")?;
        Bytes::from_static(REDOC_JS_GZIP)
    } else {
        Bytes::from_static(REDOC_JS)
    };
    send(
        session,
        ctx,
        response,
        "text/javascript; charset=utf-8",
        body,
    )
    .await
}

/// The bundle's entity tag in one form: its CRC-32 and length, which the gzip form's last eight
/// bytes hold (RFC 1952), so nothing is computed; the gzip form's adds `-gzip`, as a strong tag
/// names one form's bytes.
fn bundle_tag(gzip: bool) -> String {
    let trailer = &REDOC_JS_GZIP[REDOC_JS_GZIP.len() - 8..];
    let word = |at: usize| u32::from_le_bytes(trailer[at..at + 4].try_into().expect("4 bytes"));
    let form = if gzip { "-gzip" } else { "" };
    format!("\"{:08x}-{:x}{form}\"", word(0), word(4))
}

/// Whether `request`'s `Accept-Encoding` takes gzip (RFC 9110 section 12.5.3): named (or as
/// `x-gzip`), or else covered by `*`, with a weight above 0. A weight that does not parse
/// counts as 0.
fn accepts_gzip(request: &RequestHeader) -> bool {
    let (mut gzip, mut any) = (None, None);
    let items = request
        .headers
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','));
    for item in items {
        let mut parts = item.split(';');
        let coding = parts.next().unwrap_or_default().trim();
        let weight = parts
            .find_map(|param| {
                let (name, value) = param.split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("q")
                    .then(|| value.trim().parse::<f32>().unwrap_or(0.0))
            })
            .unwrap_or(1.0);
        if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
            gzip = Some(weight);
        } else if coding == "*" {
            any = Some(weight);
        }
    }
    gzip.or(any).is_some_and(|weight| weight > 0.0)
}

/// Whether `request`'s `If-None-Match` names `tag`, or is `*`: the client's copy is current
/// (RFC 9110 section 13.1.2, which compares tags weakly).
fn names_tag(request: &RequestHeader, tag: &str) -> bool {
    request
        .headers
        .get_all(IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .any(|named| named == "*" || named.strip_prefix("W/").unwrap_or(named) == tag)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A GET of the bundle with these headers.
    fn bundle_request(headers: &[(&str, &str)]) -> RequestHeader {
        let mut request = RequestHeader::build("GET", REDOC_PATH.as_bytes(), None).unwrap();
        for (name, value) in headers {
            request.append_header(name.to_string(), *value).unwrap();
        }
        request
    }

    #[test]
    fn gzip_is_sent_to_clients_that_take_it_and_to_them_alone() {
        for (accept, gzip) in [
            ("gzip, deflate, br, zstd", true), // Chromium
            ("GZIP", true),
            ("br;q=1.0, gzip;q=0.8, *;q=0.1", true),
            ("x-gzip", true),
            ("*", true),
            ("identity", false),
            ("gzip;q=0", false),
            ("gzip; q=0.000", false),
            ("gzip;q=oops", false),
            ("*;q=0", false),
            ("gzip;q=0, *", false), // named, gzip's own weight decides
            ("br", false),
            ("", false),
        ] {
            assert_eq!(
                accepts_gzip(&bundle_request(&[("Accept-Encoding", accept)])),
                gzip,
                "{accept}"
            );
        }
        assert!(
            !accepts_gzip(&bundle_request(&[])),
            "no header: the bundle as it is"
        );
        let two = bundle_request(&[("Accept-Encoding", "br"), ("Accept-Encoding", "gzip")]);
        assert!(accepts_gzip(&two), "every Accept-Encoding line counts");
    }

    #[test]
    fn each_form_has_its_own_tag_from_the_bundles_crc_and_length() {
        let plain = bundle_tag(false);
        let gzip = bundle_tag(true);
        assert_eq!(gzip, format!("{}-gzip\"", plain.trim_end_matches('"')));
        let length = plain.trim_matches('"').split_once('-').unwrap().1;
        assert_eq!(
            u64::from_str_radix(length, 16).unwrap(),
            REDOC_JS.len() as u64
        );
    }

    #[test]
    fn a_copy_is_current_when_its_tag_is_named() {
        let tag = bundle_tag(true);
        for (if_none_match, current) in [
            (tag.clone(), true),
            (format!("W/{tag}"), true),
            (format!("\"other\", {tag}"), true),
            ("*".to_owned(), true),
            (bundle_tag(false), false), // the other form's
            ("\"other\"".to_owned(), false),
        ] {
            let request = bundle_request(&[("If-None-Match", &if_none_match)]);
            assert_eq!(names_tag(&request, &tag), current, "{if_none_match}");
        }
        assert!(!names_tag(&bundle_request(&[]), &tag));
    }
}
