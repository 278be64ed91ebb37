//! What a response says about the caller's limits: the `X-RateLimit-*` headers and the IETF
//! draft's `RateLimit-Policy` and `RateLimit` fields, for a key's minute or day window or for a
//! client address's failed-authentication budget. [`crate::headers`] writes them with the rest.

use http::HeaderValue;

use crate::auth::Budget;
use crate::headers::{
    Headers, Piece, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
    X_RATELIMIT_RESET,
};
use crate::limits::{Decision, Quota, ceil_secs};
use crate::plans::Limits;

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

    /// For a key whose request no store can decide (Redis away with `fallback = "deny"`): its
    /// minute window, with nothing left until the retry the refusal asks for, as while banned.
    pub fn while_undecided(limits: Limits, policy: &HeaderValue, retry_ms: u64) -> RateHeaders {
        RateHeaders {
            name: "minute",
            limit: limits.per_minute,
            remaining: 0,
            reset_ms: retry_ms,
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

/// The draft `RateLimit` value, `"<policy>";r=<remaining>;t=<seconds>`.
fn rate_limit_field(name: &'static str, remaining: u64, seconds_left: u64) -> [Piece<'static>; 6] {
    [
        Piece::Text("\""),
        Piece::Text(name),
        Piece::Text("\";r="),
        Piece::Number(remaining),
        Piece::Text(";t="),
        Piece::Number(seconds_left),
    ]
}

/// Adds the rate-limit headers `rate` describes, at `now_ms`.
pub fn insert(headers: &mut Headers, rate: &RateHeaders, now_ms: u64) {
    headers.insert_pieces(&X_RATELIMIT_LIMIT, &[Piece::Number(rate.limit)], false);
    headers.insert_pieces(
        &X_RATELIMIT_REMAINING,
        &[Piece::Number(rate.remaining)],
        true,
    );
    headers.insert_pieces(
        &X_RATELIMIT_RESET,
        &[Piece::Number(ceil_secs(rate.reset_ms))],
        false,
    );
    headers.insert(&RATELIMIT_POLICY, rate.policy.clone());
    let seconds_left = ceil_secs(rate.reset_ms.saturating_sub(now_ms));
    headers.insert_pieces(
        &RATELIMIT,
        &rate_limit_field(rate.name, rate.remaining, seconds_left),
        true,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::value_of;

    #[test]
    fn the_draft_field_names_its_window_with_what_remains_and_the_seconds_left() {
        assert_eq!(
            value_of(&rate_limit_field("minute", 59, 42), true),
            "\"minute\";r=59;t=42"
        );
        assert_eq!(
            value_of(&rate_limit_field(FAILED_AUTH, u64::MAX, 0), true),
            format!("\"failed-auth\";r={};t=0", u64::MAX).as_str()
        );
        assert_eq!(
            key_policy(Limits {
                per_minute: 60,
                per_day: 1_000
            }),
            "\"minute\";q=60;w=60, \"day\";q=1000;w=86400"
        );
        assert_eq!(address_policy(10), "\"failed-auth\";q=10;w=60");
    }
}
