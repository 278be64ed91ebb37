//! Request handlers: one per path, dispatching on the method, each returning a full response.
//!
//! Handlers never fail: every error is an [`ApiError`] turned into the contract's JSON body here,
//! so the client sees one shape whatever went wrong.

use bytes::{Buf, BytesMut};
use futures_util::{Stream, StreamExt};
use warp::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use warp::reply::Response;

use crate::errors::ApiError;
use crate::models::{self, ListQuery};
use crate::store::{Created, IdempotencyKey, Store, unix_now};
use animal_store_contract::{ErrorCode, JSON_CONTENT_TYPE};

/// The public path of the collection; `Location` and `Link` are built from it.
pub const PETS_PATH: &str = "/v1/pets";
/// Header carrying a client's idempotency key for a create.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Header by which the gateway names the API key of the request; scopes idempotency keys.
pub const API_KEY_ID: &str = "x-api-key-id";
/// Longest accepted idempotency key.
pub const MAX_IDEMPOTENCY_KEY: usize = 255;

/// Per-service settings the handlers need.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: u64,
}

/// `/v1/pets`: GET (and HEAD, whose body hyper leaves out) lists, POST creates.
pub async fn collection<S, B>(
    method: Method,
    raw_query: String,
    headers: HeaderMap,
    body: S,
    store: Store,
    limits: Limits,
) -> Response
where
    S: Stream<Item = Result<B, warp::Error>> + Send,
    B: Buf,
{
    let mut body = std::pin::pin!(body);
    let result = match method {
        Method::GET | Method::HEAD => list(&raw_query, &store),
        Method::POST => create(&headers, body.as_mut(), &store, limits).await,
        _ => Err(ApiError::method_not_allowed("GET, HEAD, POST")),
    };
    match result {
        Ok(response) => response,
        Err(error) => {
            let drained = linger(body).await;
            let mut response = error.into_response();
            if !drained {
                // The body is still on the wire: the connection cannot be reused, and a client
                // that does not hear so would send its next request into a closed socket.
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            response
        }
    }
}

/// After refusing a request before reading all its body, read and discard the rest for up to
/// this long, as nginx's `lingering_close` does: a client still sending would otherwise get a
/// connection reset instead of the answer.
const LINGER_TIME: std::time::Duration = std::time::Duration::from_secs(5);
/// ... and at most this many bytes.
const LINGER_BYTES: usize = 64 * 1024 * 1024;

/// Reads and discards what is left of `body` within [`LINGER_TIME`] and [`LINGER_BYTES`];
/// whether it reached the end.
async fn linger<S, B>(mut body: std::pin::Pin<&mut S>) -> bool
where
    S: Stream<Item = Result<B, warp::Error>> + Send,
    B: Buf,
{
    let deadline = tokio::time::Instant::now() + LINGER_TIME;
    let mut drained = 0;
    loop {
        match tokio::time::timeout_at(deadline, body.next()).await {
            Ok(None) => return true,
            Ok(Some(Ok(chunk))) if drained + chunk.remaining() <= LINGER_BYTES => {
                drained += chunk.remaining();
            }
            _ => return false,
        }
    }
}

/// `/v1/pets/{petId}`: GET and HEAD only (deprecated at the gateway).
pub async fn item(pet_id: String, method: Method, store: Store) -> Response {
    let result = match method {
        Method::GET | Method::HEAD => get(&pet_id, &store),
        _ => Err(ApiError::method_not_allowed("GET, HEAD")),
    };
    result.unwrap_or_else(ApiError::into_response)
}

fn list(raw_query: &str, store: &Store) -> Result<Response, ApiError> {
    let query = models::parse_list_query(raw_query)?;
    let (page, more) = store.list(&query).map_err(ApiError::from_store)?;
    let mut response = json_response(StatusCode::OK, &page);
    if more && let Some(last) = page.last() {
        let link = next_link(&query, last.id);
        if let Ok(value) = HeaderValue::from_str(&link) {
            response.headers_mut().insert(header::LINK, value);
        }
    }
    Ok(response)
}

/// The RFC 8288 `Link` to the page after `last_id`, keeping `limit` and `status`.
fn next_link(query: &ListQuery, last_id: i64) -> String {
    let status = query
        .status
        .map(|s| format!("&status={}", s.as_str()))
        .unwrap_or_default();
    format!(
        "<{PETS_PATH}?limit={}{status}&cursor={}>; rel=\"next\"",
        query.limit,
        models::encode_cursor(last_id)
    )
}

async fn create<S, B>(
    headers: &HeaderMap,
    body: std::pin::Pin<&mut S>,
    store: &Store,
    limits: Limits,
) -> Result<Response, ApiError>
where
    S: Stream<Item = Result<B, warp::Error>> + Send,
    B: Buf,
{
    if declared_length(headers).is_some_and(|len| len > limits.max_body_bytes) {
        return Err(too_large(limits));
    }
    require_json(headers)?;
    let body = read_limited(body, limits).await?;
    let new = models::parse_new_pet(&body)?;
    let idempotency = idempotency_key(headers)?;
    let (pet, replayed) = match store
        .create(new, idempotency, unix_now())
        .await
        .map_err(ApiError::from_store)?
    {
        Created::New(pet) => (pet, false),
        Created::Replayed(pet) => (pet, true),
        Created::KeyReused => {
            return Err(ApiError::new(
                ErrorCode::IdempotencyKeyReused,
                "this Idempotency-Key was used in the last 24 hours for a different request",
            ));
        }
    };
    let mut response = json_response(StatusCode::CREATED, &pet);
    let headers = response.headers_mut();
    if let Ok(location) = HeaderValue::from_str(&format!("{PETS_PATH}/{}", pet.id)) {
        headers.insert(header::LOCATION, location);
    }
    if replayed {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// The `Idempotency-Key` header (IETF draft: a structured-field string, so it may be quoted),
/// scoped to the API key id the gateway forwards.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or("");
    let key = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text);
    if key.is_empty()
        || key.len() > MAX_IDEMPOTENCY_KEY
        || !key.bytes().all(|b| b.is_ascii_graphic() && b != b'"')
    {
        return Err(ApiError::invalid_parameter(format!(
            "`Idempotency-Key` must be 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters"
        )));
    }
    let scope = headers
        .get(API_KEY_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    Ok(Some(IdempotencyKey {
        scope,
        key: key.to_owned(),
    }))
}

fn get(pet_id: &str, store: &Store) -> Result<Response, ApiError> {
    let id = models::parse_pet_id(pet_id)?;
    match store.get(id).map_err(ApiError::from_store)? {
        Some(pet) => Ok(json_response(StatusCode::OK, &pet)),
        None => Err(ApiError::not_found(format!("no pet with id {id}"))),
    }
}

fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Accepts `application/json`, with parameters such as `charset`, in any letter case.
fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case(JSON_CONTENT_TYPE));
    if is_json {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            "the request body must be sent with Content-Type: application/json",
        ))
    }
}

/// Reads the body, refusing it as soon as it passes the limit (chunked bodies included).
async fn read_limited<S, B>(
    mut body: std::pin::Pin<&mut S>,
    limits: Limits,
) -> Result<BytesMut, ApiError>
where
    S: Stream<Item = Result<B, warp::Error>> + Send,
    B: Buf,
{
    let mut collected = BytesMut::new();
    while let Some(chunk) = body.next().await {
        let mut chunk = chunk
            .map_err(|_| ApiError::invalid_json("the request body could not be read completely"))?;
        if collected.len() as u64 + chunk.remaining() as u64 > limits.max_body_bytes {
            return Err(too_large(limits));
        }
        while chunk.has_remaining() {
            let part = chunk.chunk();
            collected.extend_from_slice(part);
            let n = part.len();
            chunk.advance(n);
        }
    }
    Ok(collected)
}

fn too_large(limits: Limits) -> ApiError {
    ApiError::new(
        ErrorCode::PayloadTooLarge,
        format!(
            "the request body is larger than {} bytes",
            limits.max_body_bytes
        ),
    )
}

fn json_response<T: serde::Serialize>(status: StatusCode, value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => {
            let mut response = Response::new(body.into());
            *response.status_mut() = status;
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(JSON_CONTENT_TYPE),
            );
            response
        }
        Err(e) => {
            log::error!("could not serialize a response: {e}");
            ApiError::new(ErrorCode::InternalError, "an internal error occurred").into_response()
        }
    }
}
