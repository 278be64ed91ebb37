//! Errors of the backend and their one mapping to HTTP.
//!
//! Handlers return [`ApiError`] for what a client did wrong or what failed on our side; the
//! single [`ApiError::into_response`] turns it into the contract's JSON body. Store failures are
//! logged here with their detail and reach the client only as a generic message.

use animal_store_contract::{ErrorBody, ErrorCode, JSON_CONTENT_TYPE};
use warp::http::{HeaderValue, StatusCode, header};
use warp::reply::Response;

/// Failures of the sled-backed store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// sled reported an error (I/O, corruption, full disk).
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    /// A stored record did not decode; the database holds something we did not write.
    #[error("stored record {id} does not decode: {source}")]
    Corrupt {
        /// The pet id whose record is bad.
        id: i64,
        /// The decoding error.
        source: serde_json::Error,
    },
    /// The id generator ran past int64.
    #[error("pet ids are exhausted")]
    IdsExhausted,
    /// The store is closing and takes no more writes.
    #[error("the store is shutting down")]
    ShuttingDown,
    /// The database is being reopened after an I/O failure.
    #[error("the database is being reopened after an I/O failure")]
    Recovering,
}

/// An error answer: a contract code, a message for people, and (for 405) the allowed methods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The contract code; it fixes the HTTP status.
    pub code: ErrorCode,
    /// Names the field or parameter at fault; never internals.
    pub message: String,
    /// For 405: the value of the `Allow` header.
    pub allow: Option<&'static str>,
}

impl ApiError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            allow: None,
        }
    }

    /// 400 `invalid_json`.
    pub fn invalid_json(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidJson, message)
    }

    /// 400 `validation_failed`.
    pub fn validation(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::ValidationFailed, message)
    }

    /// 400 `invalid_parameter`.
    pub fn invalid_parameter(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidParameter, message)
    }

    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }

    /// 405 `method_not_allowed` with the methods the path does allow.
    pub fn method_not_allowed(allow: &'static str) -> Self {
        ApiError {
            allow: Some(allow),
            ..Self::new(
                ErrorCode::MethodNotAllowed,
                format!("this path allows only {allow}"),
            )
        }
    }

    /// Maps a store failure: logged in full, answered as 503 (cannot write now) or 500.
    pub fn from_store(err: StoreError) -> Self {
        match &err {
            StoreError::ShuttingDown => Self::new(
                ErrorCode::Unavailable,
                "the service is shutting down; retry shortly",
            ),
            StoreError::Recovering => Self::new(
                ErrorCode::Unavailable,
                "the service cannot store data right now; retry later",
            ),
            StoreError::Sled(sled::Error::Io(_)) => {
                log::error!("store I/O failure: {err}");
                Self::new(
                    ErrorCode::Unavailable,
                    "the service cannot store data right now; retry later",
                )
            }
            _ => {
                log::error!("store failure: {err}");
                Self::new(ErrorCode::InternalError, "an internal error occurred")
            }
        }
    }

    /// The HTTP response with the contract's JSON body.
    pub fn into_response(self) -> Response {
        let body = ErrorBody::new(self.code, self.message);
        let mut response = Response::new(body.to_json().into());
        *response.status_mut() =
            StatusCode::from_u16(body.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(JSON_CONTENT_TYPE),
        );
        if let Some(allow) = self.allow {
            headers.insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        response
    }
}
