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
    no_trailing_slash()
        .and(collection.or(item).unify())
        .recover(recover)
        .unify()
}

/// warp matches `/v1/pets/` as it matches `/v1/pets`, and `/v1/pets/1/` as `/v1/pets/1`. The
/// spec's paths have no trailing slash, and one resource has one path: the gateway decides
/// deprecation on the path it forwards, and a second spelling of the deprecated operation would
/// be served past its sunset. So a path ending in `/` is a path of no route: 404.
fn no_trailing_slash() -> impl Filter<Extract = (), Error = warp::Rejection> + Copy {
    warp::path::full()
        .and_then(|path: warp::path::FullPath| async move {
            if path.as_str().len() > 1 && path.as_str().ends_with('/') {
                Err(warp::reject::not_found())
            } else {
                Ok(())
            }
        })
        .untuple_one()
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
