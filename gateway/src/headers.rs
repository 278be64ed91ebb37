//! The headers on every response of the public listener: `X-RateLimit-*`, the IETF draft
//! `RateLimit-Policy` and `RateLimit` fields, `X-Request-Id`, and a deprecated operation's
//! `Deprecation`, `Sunset` and `Link`. One function decorates proxied responses and the
//! gateway's own alike, so they cannot differ.

use bytes::Bytes;
use http::HeaderValue;
use pingora::http::ResponseHeader;

use crate::auth::Budget;
use crate::limits::{Decision, Quota, ceil_secs};
use crate::plans::Limits;
use crate::proxy::Ctx;

/// What a response says about the caller's limits.
#[derive(Debug, Clone)]
pub struct RateHeaders {
    /// Draft policy name of the window described (`minute`, `day`, `failed-auth`).
    pub name: &'static str,
    /// `X-RateLimit-Limit`.
    pub limit: u64,
    /// `X-RateLimit-Remaining`.
    pub remaining: u64,
    /// Reset, Unix milliseconds.
    pub reset_ms: u64,
    /// `RateLimit-Policy`, rendered once per key.
    pub policy: HeaderValue,
}

impl RateHeaders {
    /// For a key's request, from the limiter's decision.
    pub fn for_key(decision: &Decision, policy: &HeaderValue) -> RateHeaders {
        Self::for_quota(&decision.quota, policy)
    }

    /// For a key, describing `quota`.
    pub fn for_quota(quota: &Quota, policy: &HeaderValue) -> RateHeaders {
        RateHeaders {
            name: quota.name,
            limit: quota.limit,
            remaining: quota.remaining,
            reset_ms: quota.reset_ms,
            policy: policy.clone(),
        }
    }

    /// For an unauthenticated request: the client address's failed-authentication budget.
    pub fn for_address(budget: &Budget, policy: &HeaderValue) -> RateHeaders {
        RateHeaders {
            name: FAILED_AUTH,
            limit: budget.limit.into(),
            remaining: budget.remaining.into(),
            reset_ms: budget.reset_ms,
            policy: policy.clone(),
        }
    }
}

/// Draft policy name of the failed-authentication budget.
pub const FAILED_AUTH: &str = "failed-auth";

/// The `RateLimit-Policy` value for a key with `limits`.
pub fn key_policy(limits: Limits) -> HeaderValue {
    let text = format!(
        "\"minute\";q={};w=60, \"day\";q={};w=86400",
        limits.per_minute, limits.per_day
    );
    HeaderValue::try_from(text).expect("digits and quotes are valid header text")
}

/// The `RateLimit-Policy` value for the failed-authentication budget.
pub fn address_policy(per_minute: u32) -> HeaderValue {
    HeaderValue::try_from(format!("\"{FAILED_AUTH}\";q={per_minute};w=60"))
        .expect("valid header text")
}

/// A number as a header value, in one allocation (`HeaderValue::from(u64)` takes two).
fn number(n: u64) -> HeaderValue {
    HeaderValue::from_str(itoa::Buffer::new().format(n)).expect("digits are header text")
}

/// The draft `RateLimit` value, `"<policy>";r=<remaining>;t=<seconds>`, built without `format!`.
fn rate_limit_field(name: &str, remaining: u64, seconds_left: u64) -> HeaderValue {
    let (mut r, mut t) = (itoa::Buffer::new(), itoa::Buffer::new());
    let parts = [
        "\"",
        name,
        "\";r=",
        r.format(remaining),
        ";t=",
        t.format(seconds_left),
    ];
    let mut text = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        text.extend_from_slice(part.as_bytes());
    }
    // Exactly as long as its capacity: `Bytes` takes the vector without copying it.
    HeaderValue::from_maybe_shared(Bytes::from(text))
        .expect("a policy name and digits are header text")
}

/// Adds the rate-limit headers `rate` describes, at `now_ms`.
pub fn insert_rate_headers(
    response: &mut ResponseHeader,
    rate: &RateHeaders,
    now_ms: u64,
) -> pingora::Result<()> {
    response.insert_header("X-RateLimit-Limit", number(rate.limit))?;
    response.insert_header("X-RateLimit-Remaining", number(rate.remaining))?;
    response.insert_header("X-RateLimit-Reset", number(ceil_secs(rate.reset_ms)))?;
    response.insert_header("RateLimit-Policy", rate.policy.clone())?;
    let seconds_left = ceil_secs(rate.reset_ms.saturating_sub(now_ms));
    response.insert_header(
        "RateLimit",
        rate_limit_field(rate.name, rate.remaining, seconds_left),
    )
}

/// Adds the limit, identity, deprecation and CORS headers of the request in `ctx`.
pub fn decorate(response: &mut ResponseHeader, ctx: &Ctx) -> pingora::Result<()> {
    if let Some(rate) = &ctx.rate {
        insert_rate_headers(response, rate, ctx.now_ms)?;
    }
    response.insert_header("X-Request-Id", ctx.request_id.header())?;
    if let Some(origin) = &ctx.cors {
        crate::cors::decorate(response, origin)?;
    }
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
mod tests {
    use super::*;

    #[test]
    fn values_render_as_the_draft_and_the_x_headers_say() {
        assert_eq!(number(0), "0");
        assert_eq!(number(u64::MAX), u64::MAX.to_string().as_str());
        assert_eq!(rate_limit_field("minute", 59, 42), "\"minute\";r=59;t=42");
        assert_eq!(
            rate_limit_field(FAILED_AUTH, u64::MAX, 0),
            format!("\"failed-auth\";r={};t=0", u64::MAX).as_str()
        );
    }
}
