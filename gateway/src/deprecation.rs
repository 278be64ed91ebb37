//! Deprecated operations: the headers that announce them, and what happens after the sunset.
//!
//! Configured per route and method (`[[gateway.routes.deprecations]]`), never hard-coded. While
//! a deprecated operation is served, its responses carry `Deprecation: @<unix seconds>`
//! (RFC 9745), `Sunset: <HTTP date>` (RFC 8594) and `Link` entries to the successor and the
//! documentation. After the sunset the gateway answers 410 `gone`, or keeps forwarding if so
//! configured.

use http::HeaderValue;
use std::time::{Duration, SystemTime};

/// What the gateway does with a deprecated operation after its sunset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AfterSunset {
    /// Answer 410 `gone` without forwarding (the default).
    Gone,
    /// Keep forwarding, still with the deprecation headers.
    Forward,
}

/// One deprecated operation, with its headers rendered once at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deprecation {
    /// The method it applies to, upper case.
    pub method: String,
    /// Path pattern segments; `{name}` matches any one non-empty segment.
    pattern: Vec<String>,
    /// Unix seconds of the sunset.
    pub sunset_unix: u64,
    /// What to do after the sunset.
    pub after_sunset: AfterSunset,
    /// `Deprecation` header value.
    pub deprecation_header: HeaderValue,
    /// `Sunset` header value.
    pub sunset_header: HeaderValue,
    /// `Link` header values (successor, documentation).
    pub links: Vec<HeaderValue>,
}

impl Deprecation {
    /// Builds a deprecation; fails with a sentence when a value cannot be a header.
    pub fn new(
        method: &str,
        path_pattern: &str,
        deprecated_unix: u64,
        sunset_unix: u64,
        successor: Option<&str>,
        documentation: Option<&str>,
        after_sunset: AfterSunset,
    ) -> Result<Deprecation, String> {
        let header = |s: String| {
            HeaderValue::try_from(s)
                .map_err(|_| "contains characters not allowed in a header".to_owned())
        };
        let sunset_time = SystemTime::UNIX_EPOCH + Duration::from_secs(sunset_unix);
        let mut links = Vec::new();
        if let Some(successor) = successor {
            links.push(header(format!("<{successor}>; rel=\"successor-version\""))?);
        }
        if let Some(doc) = documentation {
            links.push(header(format!("<{doc}>; rel=\"deprecation\""))?);
        }
        if !path_pattern.starts_with('/') {
            return Err(format!("path `{path_pattern}` must start with `/`"));
        }
        Ok(Deprecation {
            method: method.to_ascii_uppercase(),
            pattern: without_trailing_slash(path_pattern)
                .split('/')
                .skip(1)
                .map(str::to_owned)
                .collect(),
            sunset_unix,
            after_sunset,
            deprecation_header: header(format!("@{deprecated_unix}"))?,
            sunset_header: header(httpdate::fmt_http_date(sunset_time))?,
            links,
        })
    }

    /// Whether this deprecation covers `method` on the normalized `path`. A deprecated GET
    /// covers HEAD too: HEAD is answered with GET's headers (RFC 9110, section 9.3.2). One
    /// trailing slash, on the path or the pattern, is no other operation: many upstreams serve
    /// `/orders/7/` as `/orders/7`, and that spelling must not escape the headers or the 410.
    pub fn applies(&self, method: &str, path: &str) -> bool {
        let same = method.eq_ignore_ascii_case(&self.method)
            || (self.method == "GET" && method.eq_ignore_ascii_case("HEAD"));
        if !same {
            return false;
        }
        let mut segments = without_trailing_slash(path).split('/').skip(1);
        let all_match = self.pattern.iter().all(|want| {
            segments.next().is_some_and(|seg| {
                let is_param = want.starts_with('{') && want.ends_with('}');
                if is_param {
                    !seg.is_empty()
                } else {
                    seg == want
                }
            })
        });
        all_match && segments.next().is_none()
    }

    /// Whether the operation is past its sunset at `now_unix` and should answer 410.
    pub fn is_gone(&self, now_unix: u64) -> bool {
        self.after_sunset == AfterSunset::Gone && now_unix >= self.sunset_unix
    }
}

/// `path` without one trailing `/`; `/` itself stays.
fn without_trailing_slash(path: &str) -> &str {
    match path.strip_suffix('/') {
        Some(rest) if !rest.is_empty() => rest,
        _ => path,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get_pet(after: AfterSunset) -> Deprecation {
        Deprecation::new(
            "get",
            "/v1/pets/{petId}",
            1_764_892_800,
            1_922_659_200,
            Some("/v1/pets"),
            Some("https://docs.example/deprecations"),
            after,
        )
        .unwrap()
    }

    #[test]
    fn headers_follow_the_rfcs() {
        let d = get_pet(AfterSunset::Gone);
        assert_eq!(d.deprecation_header, "@1764892800");
        assert_eq!(d.sunset_header, "Thu, 05 Dec 2030 00:00:00 GMT");
        assert_eq!(d.links[0], "</v1/pets>; rel=\"successor-version\"");
        assert_eq!(
            d.links[1],
            "<https://docs.example/deprecations>; rel=\"deprecation\""
        );
    }

    #[test]
    fn applies_only_to_its_method_and_pattern() {
        let d = get_pet(AfterSunset::Gone);
        assert!(d.applies("GET", "/v1/pets/12"));
        assert!(
            d.applies("HEAD", "/v1/pets/12"),
            "HEAD carries GET's headers"
        );
        assert!(d.applies("get", "/v1/pets/abc"));
        assert!(!d.applies("POST", "/v1/pets/12"));
        assert!(!d.applies("GET", "/v1/pets"));
        assert!(!d.applies("GET", "/v1/pets/"));
        assert!(!d.applies("GET", "/v1/pets/12/toys"));
        assert!(
            d.applies("GET", "/v1/pets/12/"),
            "a trailing slash is the same operation"
        );
        assert!(!d.applies("GET", "/v1/pets/12//"));
    }

    #[test]
    fn a_pattern_with_a_trailing_slash_covers_both_spellings() {
        let d =
            Deprecation::new("DELETE", "/v1/orders/", 0, 1, None, None, AfterSunset::Gone).unwrap();
        assert!(d.applies("DELETE", "/v1/orders/"));
        assert!(d.applies("DELETE", "/v1/orders"));
        assert!(!d.applies("DELETE", "/v1/orders/7"));
        assert!(!d.applies("DELETE", "/v1"));
        assert_eq!(without_trailing_slash("/"), "/");
    }

    #[test]
    fn gone_after_sunset_unless_configured_to_forward() {
        assert!(!get_pet(AfterSunset::Gone).is_gone(1_922_659_199));
        assert!(get_pet(AfterSunset::Gone).is_gone(1_922_659_200));
        assert!(!get_pet(AfterSunset::Forward).is_gone(2_000_000_000));
    }
}
