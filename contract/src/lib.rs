//! The wire types both Animal Store services share.
//!
//! Every error response, whether the gateway or the backend wrote it, carries the same JSON body
//! `{"code": "...", "message": "...", "status": N}` (contract section 2). This crate is the one
//! place that body and its codes are defined, so the two services cannot drift apart.

use serde::{Deserialize, Serialize};

/// The machine-readable error codes of the public contract, each tied to its HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// 400: the body is not valid JSON, or not a JSON object.
    InvalidJson,
    /// 400: a body field is missing, of the wrong type, out of range, or unknown.
    ValidationFailed,
    /// 400: a query or path parameter is malformed or out of range.
    InvalidParameter,
    /// 400: a request the gateway refuses to route (dot-segments, encoded slashes, NUL).
    InvalidRequest,
    /// 401: no, malformed, unknown or revoked bearer key.
    Unauthorized,
    /// 404: no such pet, or no route for the path.
    NotFound,
    /// 405: the path exists but not with this method.
    MethodNotAllowed,
    /// 410: a deprecated operation after its removal date.
    Gone,
    /// 422: an `Idempotency-Key` reused within 24 hours for a different request.
    IdempotencyKeyReused,
    /// 413: the request body is over the limit.
    PayloadTooLarge,
    /// 415: a request body that is not `application/json`.
    UnsupportedMediaType,
    /// 429: the key's per-minute limit is spent.
    RateLimited,
    /// 429: the key's per-day quota is spent.
    QuotaExceeded,
    /// 429: the key is temporarily banned.
    KeyBanned,
    /// 429: this client address sent too many requests with bad keys.
    TooManyAuthFailures,
    /// 500: a fault of ours.
    InternalError,
    /// 502: the upstream could not be reached or answered garbage.
    BadGateway,
    /// 503: the service is shutting down, overloaded, or cannot write.
    Unavailable,
    /// 504: the upstream did not answer in time.
    GatewayTimeout,
}

impl ErrorCode {
    /// Every code, in contract order; used by tests and documentation checks.
    pub const ALL: [ErrorCode; 19] = [
        ErrorCode::InvalidJson,
        ErrorCode::ValidationFailed,
        ErrorCode::InvalidParameter,
        ErrorCode::InvalidRequest,
        ErrorCode::Unauthorized,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::Gone,
        ErrorCode::IdempotencyKeyReused,
        ErrorCode::PayloadTooLarge,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::RateLimited,
        ErrorCode::QuotaExceeded,
        ErrorCode::KeyBanned,
        ErrorCode::TooManyAuthFailures,
        ErrorCode::InternalError,
        ErrorCode::BadGateway,
        ErrorCode::Unavailable,
        ErrorCode::GatewayTimeout,
    ];

    /// The code as it appears in the `code` field.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidJson => "invalid_json",
            ErrorCode::ValidationFailed => "validation_failed",
            ErrorCode::InvalidParameter => "invalid_parameter",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Gone => "gone",
            ErrorCode::IdempotencyKeyReused => "idempotency_key_reused",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::QuotaExceeded => "quota_exceeded",
            ErrorCode::KeyBanned => "key_banned",
            ErrorCode::TooManyAuthFailures => "too_many_auth_failures",
            ErrorCode::InternalError => "internal_error",
            ErrorCode::BadGateway => "bad_gateway",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::GatewayTimeout => "gateway_timeout",
        }
    }

    /// The HTTP status this code is always sent with.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::InvalidJson
            | ErrorCode::ValidationFailed
            | ErrorCode::InvalidParameter
            | ErrorCode::InvalidRequest => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::Gone => 410,
            ErrorCode::IdempotencyKeyReused => 422,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::UnsupportedMediaType => 415,
            ErrorCode::RateLimited
            | ErrorCode::QuotaExceeded
            | ErrorCode::KeyBanned
            | ErrorCode::TooManyAuthFailures => 429,
            ErrorCode::InternalError => 500,
            ErrorCode::BadGateway => 502,
            ErrorCode::Unavailable => 503,
            ErrorCode::GatewayTimeout => 504,
        }
    }
}

/// The JSON error body of the contract. Build it with [`ErrorBody::new`] so that `status` always
/// matches the code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Machine-readable code, one of [`ErrorCode`].
    pub code: String,
    /// Human-readable description naming the field or parameter at fault; never internals.
    pub message: String,
    /// The HTTP status, equal to the response's status.
    pub status: u16,
}

impl ErrorBody {
    /// An error body for `code` with a message for people.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorBody {
            code: code.as_str().to_owned(),
            message: message.into(),
            status: code.status(),
        }
    }

    /// The body serialized as JSON bytes.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing a struct of strings and an integer cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The media type of every JSON body, errors included.
pub const JSON_CONTENT_TYPE: &str = "application/json";

/// The OpenAPI 3.1 description of the public `/v1` API (`contract/openapi.yaml`).
pub const OPENAPI_YAML: &str = include_str!("../openapi.yaml");

/// Where the gateway serves [`OPENAPI_YAML`], without a key.
pub const OPENAPI_PATH: &str = "/v1/openapi.yaml";

/// Where the gateway serves the HTML reference of the API, without a key.
pub const DOCS_PATH: &str = "/v1/docs";

/// The reference page: Redoc rendering [`OPENAPI_YAML`] in the browser.
pub const DOCS_HTML: &str = include_str!("../docs/index.html");

/// Where the page's one script is served from (by the gateway: no network needed).
pub const REDOC_PATH: &str = "/v1/docs/redoc.standalone.js";

/// Redoc's standalone bundle, vendored at a pinned version by `contract/docs/refresh.sh`.
pub const REDOC_JS: &[u8] = include_bytes!("../docs/redoc.standalone.js");

/// [`REDOC_JS`] compressed with gzip once, when it was vendored (`gzip -9 -n`, by the same
/// script): 0.65 MB in place of 2.3 MB for every client that accepts gzip, as browsers do. Its
/// last eight bytes are the CRC-32 and the length of [`REDOC_JS`], as gzip writes them.
pub const REDOC_JS_GZIP: &[u8] = include_bytes!("../docs/redoc.standalone.js.gz");

/// Where a client reads its key's standing without spending a request (`GET`).
pub const RATE_LIMIT_PATH: &str = "/v1/rate_limit";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_status_matches_code_for_every_code() {
        for code in ErrorCode::ALL {
            let body = ErrorBody::new(code, "m");
            assert_eq!(body.status, code.status());
            assert_eq!(body.code, code.as_str());
            let json: serde_json::Value = serde_json::from_slice(&body.to_json()).unwrap();
            assert_eq!(json["status"], code.status());
            assert_eq!(json["code"], code.as_str());
            assert_eq!(json["message"], "m");
        }
    }

    /// The gzip form is the bundle's, byte for byte: a new bundle without `refresh.sh`'s gzip
    /// step fails here, not in a browser.
    #[test]
    fn the_gzip_bundle_is_the_bundle() {
        use std::io::Read;
        let mut unzipped = Vec::new();
        flate2::read::GzDecoder::new(REDOC_JS_GZIP)
            .read_to_end(&mut unzipped)
            .expect("a whole gzip stream");
        assert!(unzipped == REDOC_JS, "contract/docs/refresh.sh makes both");
    }
}
