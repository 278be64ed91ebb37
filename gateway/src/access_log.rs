//! The access log: one line per request, as text or as one JSON object, chosen by
//! `gateway.access_log` (`off` by default). It names keys by their public id, never the key, and
//! writes the path without its query string (where tokens sometimes travel).

use serde::Deserialize;

/// `gateway.access_log`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessLog {
    /// No access log.
    #[default]
    Off,
    /// `client method path status key=.. id=.. 1.2ms`.
    Text,
    /// One JSON object per line.
    Json,
}

/// What one access-log line says.
pub struct Entry<'a> {
    /// Unix milliseconds when the request was decided on.
    pub time_ms: u64,
    /// The request id (also in `X-Request-Id`).
    pub request_id: &'a str,
    /// The client address (see `gateway.trusted_proxies`).
    pub client: std::net::IpAddr,
    /// The key's public id, if it had a valid one.
    pub key_id: Option<String>,
    /// The key's plan.
    pub plan: Option<&'a str>,
    /// The method.
    pub method: &'a str,
    /// The normalized path, without the query.
    pub path: &'a str,
    /// The route's prefix, `none`, or the gateway's own page.
    pub route: &'a str,
    /// The upstream instance the request went to.
    pub upstream: Option<String>,
    /// The response status.
    pub status: u16,
    /// Milliseconds from arrival to the end of the response.
    pub latency_ms: f64,
    /// `admitted`, `answered` (the gateway's own page), or the contract code it was refused with.
    pub decision: &'a str,
}

/// Writes `entry` in `format` to the `access` log target.
pub fn write(format: AccessLog, entry: &Entry<'_>) {
    match format {
        AccessLog::Off => {}
        AccessLog::Text => log::info!(
            target: "access",
            "{} {} {} {} key={} id={} {:.1}ms {}",
            entry.client,
            entry.method,
            entry.path,
            entry.status,
            entry.key_id.as_deref().unwrap_or("-"),
            entry.request_id,
            entry.latency_ms,
            entry.decision
        ),
        AccessLog::Json => {
            let time = humantime::format_rfc3339_millis(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(entry.time_ms),
            );
            let line = serde_json::json!({
                "time": time.to_string(),
                "request_id": entry.request_id,
                "client": entry.client.to_string(),
                "key_id": entry.key_id,
                "plan": entry.plan,
                "method": entry.method,
                "path": entry.path,
                "route": entry.route,
                "upstream": entry.upstream,
                "status": entry.status,
                "latency_ms": (entry.latency_ms * 1000.0).round() / 1000.0,
                "decision": entry.decision,
            });
            log::info!(target: "access", "{line}");
        }
    }
}
