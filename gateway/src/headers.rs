//! The headers on every response of the public listener: `X-RateLimit-*`, the IETF draft
//! `RateLimit-Policy` and `RateLimit` fields, `X-Request-Id`, and a deprecated operation's
//! `Deprecation`, `Sunset` and `Link`. One function decorates proxied responses and the
//! gateway's own alike, so they cannot differ; what the rate-limit fields say is
//! [`crate::rate_headers`]'s.
//!
//! How their names are written on HTTP/1.1 is `gateway.header_case` ([`HeaderCase`]).

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};
use pingora::http::{RequestHeader, ResponseHeader};
use serde::Deserialize;

use crate::context::Ctx;
use crate::rate_headers;
pub use pieces::Piece;
pub(crate) use pieces::value_of;
use pieces::write_pieces;

mod pieces;

/// `gateway.header_case`: how header names are written on HTTP/1.1 (HTTP/2 always writes them
/// in lowercase).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HeaderCase {
    /// As they arrived, both ways, and the gateway's own as documented (`X-RateLimit-Limit`), as
    /// nginx does.
    #[default]
    Preserve,
    /// In lowercase, both ways (`x-ratelimit-limit`; a few common names, such as
    /// `Content-Type`, stay titled), as HAProxy and Envoy do by default. Header names are
    /// case-insensitive (RFC 9110, section 5.1); either way costs the same (`bench/results.md`).
    Lower,
}

/// A header the gateway writes: its name as documented, and parsed once.
pub struct Name {
    /// Written when header case is preserved.
    pub cased: &'static str,
    /// Looked up and written when it is not.
    pub parsed: HeaderName,
}

impl Name {
    /// `lower` must be `cased` in lowercase (a test checks every one).
    const fn new(cased: &'static str, lower: &'static str) -> Name {
        Name {
            cased,
            parsed: HeaderName::from_static(lower),
        }
    }
}

/// The limit of the window described.
pub const X_RATELIMIT_LIMIT: Name = Name::new("X-RateLimit-Limit", "x-ratelimit-limit");
/// What is left of it.
pub const X_RATELIMIT_REMAINING: Name = Name::new("X-RateLimit-Remaining", "x-ratelimit-remaining");
/// When it resets, Unix seconds.
pub const X_RATELIMIT_RESET: Name = Name::new("X-RateLimit-Reset", "x-ratelimit-reset");
/// The IETF draft's policies of the key.
pub const RATELIMIT_POLICY: Name = Name::new("RateLimit-Policy", "ratelimit-policy");
/// The IETF draft's remaining and seconds to reset.
pub const RATELIMIT: Name = Name::new("RateLimit", "ratelimit");
/// The request's id, to the client and upstream.
pub const X_REQUEST_ID: Name = Name::new("X-Request-Id", "x-request-id");
/// The client's address, upstream (and behind trusted proxies, from them).
pub const X_FORWARDED_FOR: Name = Name::new("X-Forwarded-For", "x-forwarded-for");
/// The scheme the client used, upstream (see [`crate::client`]).
pub const X_FORWARDED_PROTO: Name = Name::new("X-Forwarded-Proto", "x-forwarded-proto");
/// The key's public id, upstream.
pub const X_API_KEY_ID: Name = Name::new("X-Api-Key-Id", "x-api-key-id");
/// The key's plan, upstream.
pub const X_API_PLAN: Name = Name::new("X-Api-Plan", "x-api-plan");

/// Drops each client header that a server reading `_` as `-` would take for one the gateway
/// sets upstream: CGI, WSGI and Rack read both `X_Api_Key_Id` and `X-Api-Key-Id` as
/// `HTTP_X_API_KEY_ID`, and some of them keep the client's. nginx drops every name with `_` for
/// this (`underscores_in_headers off`); the gateway drops only these.
pub fn drop_aliases(request: &mut RequestHeader) {
    let aliases: Vec<HeaderName> = request
        .headers
        .keys()
        .filter(|name| is_alias(name))
        .cloned()
        .collect();
    for alias in &aliases {
        request.remove_header(alias);
    }
}

/// Whether `name` has a `_` where a header the gateway sets upstream has a `-`, and is
/// otherwise that header.
fn is_alias(name: &HeaderName) -> bool {
    let name = name.as_str().as_bytes();
    if !name.contains(&b'_') {
        return false;
    }
    let set_upstream = [
        &X_REQUEST_ID,
        &X_FORWARDED_FOR,
        &X_FORWARDED_PROTO,
        &X_API_KEY_ID,
        &X_API_PLAN,
    ];
    set_upstream.iter().any(|own| {
        let own = own.parsed.as_str().as_bytes();
        own.len() == name.len()
            && own
                .iter()
                .zip(name)
                .all(|(&o, &n)| o == n || (o == b'-' && n == b'_'))
    })
}

/// Where the gateway's headers go: as lines after an HTTP/1 message's own headers, or into the
/// header map of a response to an HTTP/2 client.
pub enum Headers<'a> {
    /// HTTP/1 (to clients, and every request upstream).
    Lines(Lines<'a>),
    /// HTTP/2, whose names are lowercase: into the map of a response that keeps no case.
    Map(&'a mut HeaderMap),
}

/// The gateway's headers of an HTTP/1 message, as the lines pingora writes after the message's
/// own (`set_h1_header_lines`, our patch to pingora-http). In the message's maps, each would
/// cost about 1,000 instructions: pingora keeps every name twice, in `http`'s map and in a map
/// of their case, and each insert hashes the name for both. A line costs its bytes. The
/// message's own values of a name written here are dropped, so a name is sent once, with the
/// gateway's value.
///
/// No lookup in the message finds these headers, and HTTP/2 would not send them: responses to
/// HTTP/2 clients take [`Headers::Map`], and upstream requests are HTTP/1 (routes offer no
/// other protocol to their upstreams).
pub struct Lines<'a> {
    message: Message<'a>,
    text: BytesMut,
    /// Names in lowercase, else as documented.
    lower: bool,
    /// Whether the message may hold a header of the gateway's own, which each line replaces.
    may_hold_ours: bool,
}

impl Lines<'_> {
    /// Writes `name`'s line, its value written by `value`, in place of the message's own.
    fn insert(&mut self, name: &Name, value: impl FnOnce(&mut BytesMut)) {
        if self.may_hold_ours {
            self.message.remove(&name.parsed);
        }
        let written = if self.lower {
            name.parsed.as_str()
        } else {
            name.cased
        };
        self.text.extend_from_slice(written.as_bytes());
        self.text.extend_from_slice(b": ");
        value(&mut self.text);
        self.text.extend_from_slice(b"\r\n");
    }
}

/// An HTTP/1 message the gateway adds headers to.
pub enum Message<'a> {
    /// A request going upstream.
    Request(&'a mut RequestHeader),
    /// A response going to the client.
    Response(&'a mut ResponseHeader),
}

impl Message<'_> {
    /// Drops the message's values of `name`. Its names are compared rather than looked up: a
    /// lookup hashes the name, a comparison with a standard name (most of a message's) is one
    /// byte's, and names of the gateway's are seldom there.
    fn remove(&mut self, name: &HeaderName) {
        if !self.headers().keys().any(|own| own == name) {
            return;
        }
        match self {
            Message::Request(r) => r.remove_header(name),
            Message::Response(r) => r.remove_header(name),
        };
    }

    fn headers(&self) -> &HeaderMap {
        match self {
            Message::Request(r) => &r.headers,
            Message::Response(r) => &r.headers,
        }
    }

    /// Whether any of the message's names may be one of the gateway's, all of which begin with
    /// `x-` or `ratelimit`. Most messages have none that begin with either letter, and then no
    /// insert needs to look for its name (ten searches of the message a request).
    fn may_hold_ours(&self) -> bool {
        self.headers()
            .keys()
            .any(|name| matches!(name.as_str().as_bytes().first(), Some(b'x' | b'r')))
    }

    fn set_lines(&mut self, lines: Bytes) {
        match self {
            Message::Request(r) => r.set_h1_header_lines(lines),
            Message::Response(r) => r.set_h1_header_lines(lines),
        }
    }
}

impl Headers<'_> {
    /// Sets `name` to `value`, replacing what was there.
    pub fn insert(&mut self, name: &Name, value: HeaderValue) {
        match self {
            Headers::Lines(lines) => lines.insert(name, |text| text.put_slice(value.as_bytes())),
            Headers::Map(map) => {
                map.insert(name.parsed.clone(), value);
            }
        }
    }

    /// Sets `name` to the value made of `pieces`, replacing what was there.
    ///
    /// `is_unique` marks a value unique to one response (the request's id, what is left of a
    /// window) for HPACK never to index it: such a value only churns an HTTP/2 connection's
    /// header table, inserted and never used again, evicting values that do repeat, and each
    /// later response's lookup of its name walks the stale values still there (3,000
    /// instructions a request, measured). Sent as literals, such values cost their names' bytes
    /// (about 23 a response). HTTP/1.1 ignores the mark.
    pub fn insert_pieces(&mut self, name: &Name, pieces: &[Piece], is_unique: bool) {
        match self {
            Headers::Lines(lines) => lines.insert(name, |text| write_pieces(pieces, text)),
            Headers::Map(map) => {
                map.insert(name.parsed.clone(), value_of(pieces, is_unique));
            }
        }
    }

    /// Runs `f` on the headers of `message` written as lines (names in lowercase if `lower`),
    /// then hands the lines to it.
    fn lines<T>(message: Message, lower: bool, f: impl FnOnce(&mut Headers) -> T) -> T {
        let may_hold_ours = message.may_hold_ours();
        let mut headers = Headers::Lines(Lines {
            message,
            text: BytesMut::with_capacity(LINES_CAPACITY),
            lower,
            may_hold_ours,
        });
        let result = f(&mut headers);
        if let Headers::Lines(mut lines) = headers {
            let text = lines.text.freeze();
            lines.message.set_lines(text);
        }
        result
    }
}

/// Room for the lines of a response's six headers with every number at its longest (about 330
/// bytes), or of a request's four (more only behind a long chain of forwarders).
const LINES_CAPACITY: usize = 384;

/// Runs `f` on the headers of `response`, going to a client over HTTP/2 if `http2`, else over
/// HTTP/1 with names as `case` says. Over HTTP/2, and for [`HeaderCase::Lower`], the response
/// becomes one that keeps no case (its reason phrase kept).
pub fn with_response_headers<T>(
    response: &mut ResponseHeader,
    case: HeaderCase,
    http2: bool,
    f: impl FnOnce(&mut Headers) -> T,
) -> pingora::Result<T> {
    if http2 {
        return in_parts(response, |parts| f(&mut Headers::Map(&mut parts.headers)));
    }
    let lower = case == HeaderCase::Lower;
    if lower {
        in_parts(response, |_| ())?;
    }
    Ok(Headers::lines(Message::Response(response), lower, f))
}

/// Runs `f` on `response` as `http` parts, which keep no case, and makes it the response they
/// then are, with its reason phrase.
fn in_parts<T>(
    response: &mut ResponseHeader,
    f: impl FnOnce(&mut http::response::Parts) -> T,
) -> pingora::Result<T> {
    let reason = response
        .get_reason_phrase()
        .filter(|r| Some(*r) != response.status.canonical_reason())
        .map(str::to_owned);
    let empty = ResponseHeader::from(http::Response::new(()).into_parts().0);
    let mut parts = http::response::Parts::from(std::mem::replace(response, empty));
    let result = f(&mut parts);
    *response = ResponseHeader::from(parts);
    response.set_reason_phrase(reason.as_deref())?;
    Ok(result)
}

/// As [`with_response_headers`], for a request going upstream over HTTP/1. A request whose
/// target is not exactly its URI's path and query (absolute-form, not UTF-8, or HTTP/2, whose
/// URI carries the scheme and authority) keeps pingora's form, which sends the target as
/// received, and the gateway's names as documented.
pub fn with_request_headers<T>(
    request: &mut RequestHeader,
    case: HeaderCase,
    f: impl FnOnce(&mut Headers) -> T,
) -> T {
    let lower = case == HeaderCase::Lower && target_is_uri(request);
    if lower {
        let empty = RequestHeader::from(http::Request::new(()).into_parts().0);
        let parts = http::request::Parts::from(std::mem::replace(request, empty));
        *request = RequestHeader::from(parts);
    }
    Headers::lines(Message::Request(request), lower, f)
}

/// Whether `request`'s target survives as its URI's path and query, which is all a request
/// rebuilt from `http` parts keeps of it.
fn target_is_uri(request: &RequestHeader) -> bool {
    request.version != http::Version::HTTP_2
        && request.uri.scheme().is_none()
        && request.raw_path_is_utf8()
        && request.uri.path_and_query().map(|p| p.as_str().as_bytes()) == Some(request.raw_path())
}

/// Makes every value of `map` hold its own bytes, not a share of a larger buffer.
fn own_values(map: &mut HeaderMap) {
    for value in map.values_mut() {
        let mut owned = HeaderValue::from_maybe_shared(Bytes::copy_from_slice(value.as_bytes()))
            .expect("the bytes of a header value");
        owned.set_sensitive(value.is_sensitive());
        *value = owned;
    }
}

/// Adds the limit, identity, deprecation and CORS headers of the request in `ctx` to a response
/// going to the client over HTTP/2 if `http2`, else over HTTP/1.
///
/// HTTP/2 writes every name in lowercase, so its responses take the case-free path whatever
/// `gateway.header_case` says, and their values are copied out of the buffer the upstream's
/// response head was read into: the connection's HPACK table keeps the values it indexes for as
/// long as the connection is open, and a value still pointing into that buffer would keep all of
/// it (4 KiB an idle connection).
pub fn decorate(response: &mut ResponseHeader, ctx: &Ctx, http2: bool) -> pingora::Result<()> {
    with_response_headers(response, ctx.settings.header_case, http2, |headers| {
        if let Headers::Map(map) = headers {
            own_values(map);
        }
        if let Some(rate) = &ctx.rate {
            rate_headers::insert(headers, rate, ctx.now_ms);
        }
        headers.insert_pieces(&X_REQUEST_ID, &[Piece::Id(&ctx.request_id)], true);
    })?;
    crate::cors::decorate(response, &ctx.cors)?;
    if let Some(d) = ctx.deprecation.as_deref() {
        response.insert_header("Deprecation", d.deprecation_header.clone())?;
        response.insert_header("Sunset", d.sunset_header.clone())?;
        for link in &d.links {
            response.append_header("Link", link.clone())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
