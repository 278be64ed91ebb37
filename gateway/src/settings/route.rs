//! One route of `[[gateway.routes]]` validated: its prefix, upstream or pool, timeout,
//! deprecations, upstream TLS and CORS. Errors start with the field's path inside the route
//! (`.upstream: ...`); [`Settings::new`](super::Settings::new) puts `gateway.routes[i]` before it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{BACKEND_UPSTREAM, GatewayConfig, HEALTH_CHECK_TIMEOUT, RouteConfig};
use crate::cors::CorsPolicy;
use crate::deprecation::Deprecation;
use crate::metrics;
use crate::routes::{Pool, Route, Upstream, UpstreamTls, normalize_path};

use super::cors_policy;

/// `route` validated; `backend` is where the `backend` upstream points, `link_base` what a
/// deprecation's relative documentation link is put after, `cors` the gateway's own policy.
pub(super) fn route_settings(
    config: &GatewayConfig,
    route: &RouteConfig,
    backend: SocketAddr,
    link_base: &str,
    cors: Option<&Arc<CorsPolicy>>,
) -> Result<Route, String> {
    let prefix = &route.prefix;
    let normal = normalize_path(prefix).map_err(|e| format!(".prefix: {}", e.message()))?;
    if normal != prefix.as_str() || !prefix.starts_with("/v1/") || prefix.ends_with('/') {
        return Err(format!(
            ".prefix: `{prefix}` must be a plain path under /v1/ without a trailing slash"
        ));
    }
    let address = |field: &str, text: &str| {
        if text == BACKEND_UPSTREAM {
            Ok(backend)
        } else {
            text.parse::<SocketAddr>().map_err(|_| {
                format!("{field}: `{text}` is neither `backend` nor an address like 127.0.0.1:9000")
            })
        }
    };
    let upstream = match (&route.upstream, route.upstreams.as_slice()) {
        (Some(one), []) => Upstream::One(address(".upstream", one)?),
        (None, [_, ..]) => {
            let mut instances = Vec::with_capacity(route.upstreams.len());
            for (k, text) in route.upstreams.iter().enumerate() {
                instances.push(address(&format!(".upstreams[{k}]"), text)?);
            }
            let pool = Pool::new(&instances, HEALTH_CHECK_TIMEOUT)
                .map_err(|e| format!(".upstreams: {e}"))?;
            Upstream::Pool(Arc::new(pool))
        }
        _ => {
            return Err(
                ".upstream: give either `upstream` (one address) or `upstreams` (a pool), not both or neither"
                    .to_owned(),
            );
        }
    };
    let timeout = route.timeout_ms.unwrap_or(config.upstream_timeout_ms);
    let mut deprecations = Vec::with_capacity(route.deprecations.len());
    for (j, d) in route.deprecations.iter().enumerate() {
        let at = |what: &str, value: &str| {
            humantime::parse_rfc3339(value)
                .map(|t| t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()))
                .map_err(|_| format!(".deprecations[{j}].{what}: `{value}` is not an RFC 3339 UTC time like 2030-12-05T00:00:00Z"))
        };
        let pattern_ok =
            d.path == route.prefix || d.path.starts_with(&format!("{}/", route.prefix));
        if !pattern_ok {
            return Err(format!(
                ".deprecations[{j}].path: `{}` is not under the route's prefix `{prefix}`",
                d.path
            ));
        }
        if http::Method::from_bytes(d.method.as_bytes()).is_err() {
            return Err(format!(
                ".deprecations[{j}].method: `{}` is not an HTTP method",
                d.method
            ));
        }
        let deprecation = Deprecation::new(
            &d.method,
            &d.path,
            at("deprecated_at", &d.deprecated_at)?,
            at("sunset", &d.sunset)?,
            d.successor.as_deref(),
            d.documentation
                .as_deref()
                .map(|doc| {
                    if doc.starts_with('/') {
                        format!("{link_base}{doc}")
                    } else {
                        doc.to_owned()
                    }
                })
                .as_deref(),
            d.after_sunset,
        )
        .map_err(|e| format!(".deprecations[{j}]: {e}"))?;
        deprecations.push(Arc::new(deprecation));
    }
    Ok(Route {
        upstream_duration: metrics::UPSTREAM_DURATION.with_label_values(&[prefix.as_str()]),
        prefix: prefix.clone(),
        upstream,
        timeout: Duration::from_millis(timeout.get()),
        deprecations,
        tls: upstream_tls(route)?,
        cors: match &route.cors {
            Some(own) => cors_policy(own).map_err(|e| format!(".cors{e}"))?,
            None => cors.cloned(),
        },
    })
}

/// The route's `tls`, `sni` and `ca`, checked: TLS needs a name to verify, and a CA file must
/// hold certificates.
fn upstream_tls(route: &RouteConfig) -> Result<Option<UpstreamTls>, String> {
    if !route.tls {
        if route.sni.is_some() || route.ca.is_some() {
            return Err(".tls: `sni` and `ca` apply only with `tls = true`".to_owned());
        }
        return Ok(None);
    }
    let sni = route.sni.clone().ok_or_else(|| {
        ".sni: with `tls = true`, give the name on the upstream's certificate".to_owned()
    })?;
    let ca = match &route.ca {
        None => None,
        Some(path) => Some(Arc::from(
            crate::tls::load_ca(path).map_err(|e| format!(".ca: {e}"))?,
        )),
    };
    Ok(Some(UpstreamTls { sni, ca }))
}
