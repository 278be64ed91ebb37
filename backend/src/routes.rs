//! The warp filters: which path goes to which handler, and the one `recover` that turns every
//! rejection into the contract's JSON error body.

use std::convert::Infallible;

use warp::Filter;
use warp::reply::Response;

use crate::errors::ApiError;
use crate::handlers::{self, Limits};
use crate::store::Store;
use animal_store_contract::ErrorCode;

/// Every route of the backend, errors included; never rejects.
pub fn routes(
    store: Store,
    limits: Limits,
) -> impl Filter<Extract = (Response,), Error = Infallible> + Clone {
    let collection = warp::path!("v1" / "pets")
        .and(warp::method())
        .and(raw_query())
        .and(warp::header::headers_cloned())
        .and(warp::body::stream())
        .and(with_store(store.clone()))
        .and(warp::any().map(move || limits))
        .then(handlers::collection);
    let item = warp::path!("v1" / "pets" / String)
        .and(warp::method())
        .and(with_store(store))
        .then(handlers::item);
    collection.or(item).unify().recover(recover).unify()
}

fn with_store(store: Store) -> impl Filter<Extract = (Store,), Error = Infallible> + Clone {
    warp::any().map(move || store.clone())
}

/// The raw query string, empty when the request has none.
fn raw_query() -> impl Filter<Extract = (String,), Error = Infallible> + Clone {
    warp::query::raw().or(warp::any().map(String::new)).unify()
}

/// The only place warp's rejections become responses. Handlers answer their own errors, so
/// what arrives here is a path that matched no route, or a fault in warp itself.
async fn recover(rejection: warp::Rejection) -> Result<Response, Infallible> {
    let error = if rejection.is_not_found() {
        ApiError::not_found("no route for this path")
    } else {
        log::error!("unhandled rejection: {rejection:?}");
        ApiError::new(ErrorCode::InternalError, "an internal error occurred")
    };
    Ok(error.into_response())
}
