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

/// A page's bytes as they are served: their media type, the gzip form if there is one, their
/// entity tag and how long a client may keep them without asking.
struct Asset {
    content_type: &'static str,
    bytes: &'static [u8],
    gzip: Option<&'static [u8]>,
    /// The bytes' CRC-32 (the one gzip writes), for the tag.
    crc: u32,
    cache_control: &'static str,
}

/// The OpenAPI description and the page change with the binary; a client keeps them but asks
/// each time, so that it sees a new gateway's at once, and a `304` answers while they are the
/// same.
const OPENAPI: Asset = Asset {
    content_type: "application/yaml",
    bytes: OPENAPI_YAML.as_bytes(),
    gzip: None,
    crc: crc32(OPENAPI_YAML.as_bytes()),
    cache_control: "no-cache",
};

/// The reference page, served as [`OPENAPI`] is.
const DOCS: Asset = Asset {
    content_type: "text/html; charset=utf-8",
    bytes: DOCS_HTML.as_bytes(),
    gzip: None,
    crc: crc32(DOCS_HTML.as_bytes()),
    cache_control: "no-cache",
};

/// Redoc's bundle, as nginx serves a static file with `gzip_static`: compressed to a client
/// that accepts gzip (0.65 MB in place of 2.3), whole to others, with `Vary: Accept-Encoding`;
/// kept by the client for a day, then revalidated by its tag. Its CRC-32 is the one the gzip
/// form's trailer holds (RFC 1952), read rather than computed over 2.3 MB.
const REDOC: Asset = Asset {
    content_type: "text/javascript; charset=utf-8",
    bytes: REDOC_JS,
    gzip: Some(REDOC_JS_GZIP),
    crc: {
        let at = REDOC_JS_GZIP.len() - 8;
        let t = REDOC_JS_GZIP;
        u32::from_le_bytes([t[at], t[at + 1], t[at + 2], t[at + 3]])
    },
    cache_control: "public, max-age=86400",
};

/// The CRC-32 of `bytes` (IEEE, as gzip's), at compile time.
const fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    let mut i = 0;
    while i < bytes.len() {
        crc ^= bytes[i] as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
            bit += 1;
        }
        i += 1;
    }
    !crc
}

impl Asset {
    /// The entity tag of one form: the CRC-32 and length of the bytes it decodes to; the gzip
    /// form's adds `-gzip`, as a strong tag names one form's bytes.
    fn tag(&self, gzip: bool) -> String {
        let form = if gzip { "-gzip" } else { "" };
        format!("\"{:08x}-{:x}{form}\"", self.crc, self.bytes.len())
    }
}

/// Sends `page`.
pub async fn serve(session: &mut Session, ctx: &mut Ctx, page: Page) -> pingora::Result<()> {
    let asset = match page {
        Page::OpenApi => &OPENAPI,
        Page::Docs => &DOCS,
        Page::Redoc => &REDOC,
        Page::DocsWithSlash => {
            // Relative, so it stays on the address and listener the client used.
            let mut response = ResponseHeader::build(308, Some(8))?;
            response.insert_header("Location", DOCS_PATH)?;
            let body = Bytes::from_static(b"The API reference is at /v1/docs\n");
            return send(session, ctx, response, "text/plain; charset=utf-8", body).await;
        }
    };
    serve_asset(session, ctx, asset).await
}

/// Sends `asset`, compressed if it has a gzip form and the client takes it, or a `304` without
/// a body when the client's copy is current (`If-None-Match`).
async fn serve_asset(session: &mut Session, ctx: &mut Ctx, asset: &Asset) -> pingora::Result<()> {
    let request = session.req_header();
    let gzip = asset.gzip.filter(|_| accepts_gzip(request));
    let tag = asset.tag(gzip.is_some());
    let current = names_tag(request, &tag);
    let mut response = ResponseHeader::build(if current { 304 } else { 200 }, Some(8))?;
    response.insert_header("Cache-Control", asset.cache_control)?;
    response.insert_header("ETag", &tag)?;
    if asset.gzip.is_some() {
        response.insert_header("Vary", "Accept-Encoding")?;
    }
    let body = match gzip {
        _ if current => Bytes::new(),
        Some(gzip) => {
            response.insert_header("Content-Encoding", "gzip")?;
            Bytes::from_static(gzip)
        }
        None => Bytes::from_static(asset.bytes),
    };
    send(session, ctx, response, asset.content_type, body).await
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
        let plain = REDOC.tag(false);
        let gzip = REDOC.tag(true);
        assert_eq!(gzip, format!("{}-gzip\"", plain.trim_end_matches('"')));
        let length = plain.trim_matches('"').split_once('-').unwrap().1;
        assert_eq!(
            u64::from_str_radix(length, 16).unwrap(),
            REDOC_JS.len() as u64
        );
    }

    /// The CRC computed at compile time is gzip's: over the bundle it gives the one its gzip
    /// form's trailer holds, and the check value of the standard's test string.
    #[test]
    fn the_computed_crc_is_the_one_gzip_writes() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(REDOC_JS), REDOC.crc);
        assert_ne!(OPENAPI.tag(false), DOCS.tag(false));
    }

    #[test]
    fn a_copy_is_current_when_its_tag_is_named() {
        let tag = REDOC.tag(true);
        for (if_none_match, current) in [
            (tag.clone(), true),
            (format!("W/{tag}"), true),
            (format!("\"other\", {tag}"), true),
            ("*".to_owned(), true),
            (REDOC.tag(false), false), // the other form's
            ("\"other\"".to_owned(), false),
        ] {
            let request = bundle_request(&[("If-None-Match", &if_none_match)]);
            assert_eq!(names_tag(&request, &tag), current, "{if_none_match}");
        }
        assert!(!names_tag(&bundle_request(&[]), &tag));
    }
}
