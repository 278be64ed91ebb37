//! CORS for browser clients (`[gateway.cors]`, or a route's own `cors` table): off unless
//! origins are listed.
//!
//! A preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) never carries
//! `Authorization`, so the gateway answers it itself: 204, no key needed, nothing counted. Every
//! response to an allowed origin names it in `Access-Control-Allow-Origin`, says `Vary: Origin`,
//! and exposes the headers a web app needs to honour its limits, which gateways commonly forget:
//! the rate-limit fields, `Retry-After`, `Link`, `Deprecation`, `Sunset`, `Location` and
//! `X-Request-Id`. Other origins get no CORS headers at all, so the browser keeps the answer
//! from the page. Where CORS is on, every response says `Vary: Origin`, those without CORS
//! headers too (a request without `Origin`, or from another origin): a cache must not hand one
//! origin's answer to another (Fetch standard, "CORS protocol and HTTP caches").

use http::{HeaderValue, Method};
use pingora::http::{RequestHeader, ResponseHeader};

/// Request headers a browser app may send.
pub const ALLOW_HEADERS: &str = "Authorization, Content-Type, Idempotency-Key";
/// Methods a browser app may use.
pub const ALLOW_METHODS: &str = "GET, POST, PUT, PATCH, DELETE, OPTIONS";
/// Response headers a browser app may read.
pub const EXPOSE_HEADERS: &str = "X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset, \
RateLimit, RateLimit-Policy, Retry-After, Link, Deprecation, Sunset, Location, X-Request-Id";
/// Default `Access-Control-Max-Age`: how long a browser may reuse a preflight.
pub const DEFAULT_MAX_AGE_SECONDS: u64 = 600;

/// The origins allowed to call the API from a browser, and for how long a preflight holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorsPolicy {
    origins: Vec<String>,
    max_age: HeaderValue,
}

impl CorsPolicy {
    /// A policy for `origins` (each `scheme://host[:port]`, as browsers send `Origin`); `None`
    /// when the list is empty, which means CORS is off.
    pub fn new(origins: &[String], max_age_seconds: u64) -> Result<Option<CorsPolicy>, String> {
        if origins.is_empty() {
            return Ok(None);
        }
        let mut normalized = Vec::with_capacity(origins.len());
        for origin in origins {
            let lower = origin.to_ascii_lowercase();
            let rest = lower
                .strip_prefix("https://")
                .or_else(|| lower.strip_prefix("http://"));
            let valid = rest.is_some_and(|host| {
                !host.is_empty()
                    && host.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']')
                    })
            });
            if !valid {
                return Err(format!(
                    "`{origin}` is not an origin like https://app.example or http://127.0.0.1:3000 (no path, no wildcard)"
                ));
            }
            normalized.push(lower);
        }
        Ok(Some(CorsPolicy {
            origins: normalized,
            max_age: HeaderValue::from(max_age_seconds),
        }))
    }

    /// The request's `Origin`, if this policy allows it.
    pub fn allowed_origin(&self, request: &RequestHeader) -> Option<HeaderValue> {
        let origin = request.headers.get(http::header::ORIGIN)?;
        let text = origin.to_str().ok()?;
        self.origins
            .iter()
            .any(|o| o.eq_ignore_ascii_case(text))
            .then(|| origin.clone())
    }

    /// What `policy` (`None`: CORS off) makes of `request`.
    pub fn answer(policy: Option<&CorsPolicy>, request: &RequestHeader) -> Cors {
        match policy {
            None => Cors::Off,
            Some(policy) => match policy.allowed_origin(request) {
                Some(origin) => Cors::Allowed(origin),
                None => Cors::NotAllowed,
            },
        }
    }

    /// The headers that answer a preflight from an allowed origin.
    pub fn preflight(&self, response: &mut ResponseHeader) -> pingora::Result<()> {
        response.insert_header("Access-Control-Allow-Methods", ALLOW_METHODS)?;
        response.insert_header("Access-Control-Allow-Headers", ALLOW_HEADERS)?;
        response.insert_header("Access-Control-Max-Age", self.max_age.clone())?;
        Ok(())
    }
}

/// Whether `request` is a CORS preflight.
pub fn is_preflight(request: &RequestHeader) -> bool {
    request.method == Method::OPTIONS
        && request.headers.contains_key(http::header::ORIGIN)
        && request
            .headers
            .contains_key(http::header::ACCESS_CONTROL_REQUEST_METHOD)
}

/// What CORS makes of one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Cors {
    /// CORS is off where the request goes: nothing to add.
    #[default]
    Off,
    /// CORS is on, and the request has no `Origin` or one not allowed: `Vary: Origin` only.
    NotAllowed,
    /// An allowed origin, named in the response.
    Allowed(HeaderValue),
}

/// Marks a response as `cors` says.
pub fn decorate(response: &mut ResponseHeader, cors: &Cors) -> pingora::Result<()> {
    if let Cors::Allowed(origin) = cors {
        response.insert_header("Access-Control-Allow-Origin", origin.clone())?;
        response.insert_header("Access-Control-Expose-Headers", EXPOSE_HEADERS)?;
    }
    if !matches!(cors, Cors::Off) {
        response.append_header("Vary", "Origin")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(origin: Option<&str>) -> RequestHeader {
        let mut r = RequestHeader::build("GET", b"/v1/pets", None).unwrap();
        if let Some(o) = origin {
            r.insert_header("Origin", o).unwrap();
        }
        r
    }

    #[test]
    fn only_listed_origins_are_allowed_and_empty_lists_mean_off() {
        assert_eq!(CorsPolicy::new(&[], 600), Ok(None));
        let policy = CorsPolicy::new(&["https://App.example".to_owned()], 600)
            .unwrap()
            .unwrap();
        assert!(
            policy
                .allowed_origin(&request(Some("https://app.example")))
                .is_some()
        );
        assert!(
            policy
                .allowed_origin(&request(Some("https://evil.example")))
                .is_none()
        );
        assert!(
            policy
                .allowed_origin(&request(Some("http://app.example")))
                .is_none()
        );
        assert!(policy.allowed_origin(&request(None)).is_none());
        for bad in ["*", "app.example", "https://app.example/", "https://"] {
            assert!(CorsPolicy::new(&[bad.to_owned()], 600).is_err(), "{bad}");
        }
    }
}
