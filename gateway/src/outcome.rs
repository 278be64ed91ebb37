//! What became of a request, as the metrics and the access log record it: its status, its
//! outcome (proxied, the gateway's own answer, a refusal's error code, the client gone or too
//! slow), its route and its latency. Called from the proxy's last phase, `logging`.

use pingora::Error;
use pingora_proxy::Session;

use crate::access_log::{self, AccessLog};
use crate::context::Ctx;
use crate::errors::client_went_away;
use crate::metrics;
use crate::proxy::{final_response, peer_ip};

/// The outcome of a request whose client went away before its response was complete, in
/// metrics and the access log (nginx logs such a request with its status 499).
const CLIENT_CLOSED: &str = "client_closed";

/// The outcome of a request whose body stopped arriving for the route's timeout: its connection
/// is closed without an answer (nginx logs such a request with its status 408).
const CLIENT_TIMEOUT: &str = "client_timeout";

/// Counts the request `ctx` in the metrics and writes its access-log line; `e` is the error that
/// ended it, if one did.
pub(crate) fn record(session: &Session, e: Option<&Error>, ctx: &Ctx) {
    // The gateway's own answer, if it gave one: it may have replaced a response that pingora
    // had begun (`retract`).
    let status = match ctx.status {
        0 => final_response(session).map_or(0, |r| r.status.as_u16()),
        own => own,
    };
    let outcome = match (ctx.error_code, ctx.answered, e) {
        (Some(code), _, _) => code.as_str(),
        (None, Some(_), _) => "answered",
        (None, None, _) if ctx.body_stalled => CLIENT_TIMEOUT,
        (None, None, Some(e)) if client_went_away(e) => CLIENT_CLOSED,
        (None, None, _) => "proxied",
    };
    let route = ctx
        .answered
        .or_else(|| ctx.route.as_ref().map(|r| r.prefix.as_str()))
        .unwrap_or("none");
    let request = session.req_header();
    let method = metrics::method_label(&request.method);
    metrics::RESPONSES
        .with_label_values(&[route, method, metrics::status_label(status), outcome])
        .inc();
    let elapsed = ctx.started.elapsed();
    metrics::DURATION.observe(elapsed.as_secs_f64());
    let format = ctx.settings.access_log;
    if format != AccessLog::Off {
        let forwarded = ctx.upstream_started.is_some();
        access_log::write(
            format,
            &access_log::Entry {
                time_ms: ctx.now_ms,
                request_id: ctx.request_id.as_str(),
                client: if ctx.client.is_unspecified() {
                    peer_ip(session)
                } else {
                    ctx.client
                },
                key_id: ctx.key.as_ref().map(|k| k.id.to_string()),
                plan: ctx.key.as_ref().and_then(|k| k.plan.to_str().ok()),
                method: request.method.as_str(),
                path: request.uri.path(),
                route,
                upstream: ctx.instance.filter(|_| forwarded).map(|i| i.to_string()),
                status,
                latency_ms: elapsed.as_secs_f64() * 1000.0,
                decision: if ["proxied", CLIENT_CLOSED, CLIENT_TIMEOUT].contains(&outcome) {
                    "admitted"
                } else {
                    outcome
                },
            },
        );
    }
}
