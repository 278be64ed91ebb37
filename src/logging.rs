//! The process's log: env_logger, as `RUST_LOG` chooses (info by default), with lines of
//! pingora's and rustls's that report what a client did, not a fault, turned down, and
//! credentials taken out of every line but the access log's
//! ([`animal_store_gateway::redact`]).

use std::borrow::Cow;

use animal_store_gateway::redact::redact;
use log::{Level, Log, Metadata, Record};

/// The access log's target (`gateway.access_log`).
const ACCESS: &str = "access";

/// Logging unless `RUST_LOG` says otherwise: info. The access log (target `access`) is chosen by
/// `gateway.access_log`. warp's server logs as an error each connection that a client closed
/// with a request unfinished (after a load test, one line per connection it had open), and
/// nothing else at that level in the way the backend serves: those lines are left out.
const DEFAULT_LOG: &str = "info,warp::server=off";

/// The level `record` is logged at: its own, except for these, which pingora 0.9 and rustls
/// log per connection or per request for what a client did (pingora's issue #201 asks the
/// same of the first):
/// - "failed to acquire reusable stream", an error: a request lost a race for an idle upstream
///   connection (the connection's idle task, on another thread, has let go of its lock but not
///   yet of its reference, so `Arc::try_unwrap` fails) and opens a new one. Nothing fails.
///   Through `serve` on two cores under `wrk` it came 204 times in 10 s. Debug.
/// - "Downstream handshake error", an error: a TLS handshake failed. A client that closed or
///   reset its connection before the handshake was done (a load balancer's TCP health check, a
///   port scan, a load test ending) is debug; any other failure (a client that does not trust
///   the certificate, or shares no protocol version) is a warning, for what it says about the
///   certificate or the clients. "Downstream handshake timeout" (60 s) is a warning too.
/// - pingora_proxy's "Fail to proxy: Downstream ConnectionClosed" or "... ReadError" "while
///   reading request headers", an error: a client closed or reset its connection in the middle of
///   a request head (a client's own timeout, a probe sending a line and hanging up). No request
///   was read, so nothing was refused or failed. Debug. (A head that is slow is the header
///   timeout's, counted in `gateway_client_timeouts_total`.)
/// - rustls's "Illegal SNI extension", a warning: the client sent an IP address as the server
///   name (wrk does), which rustls ignores. Debug.
/// - redis-rs's cluster client's "Failed to connect to node" (a warning) and "async cluster
///   client recovery: ..." (a warning, then info): each of its connections (one per proxy thread
///   and one shared) tries a failed node and refreshes its slots again and again until a replica
///   takes over; for one failed master of a three-master cluster with replicas, 42 and 28 lines
///   in 4 s. Debug. Its "connection to `<node>` lost" (once per connection) stays a warning, and
///   the gateway says once that it falls back, and again when it is back.
fn level_for(record: &Record) -> Level {
    let level = record.level();
    let text = || match record.args().as_str() {
        Some(text) => Cow::Borrowed(text),
        None => Cow::Owned(record.args().to_string()),
    };
    match (level, record.target()) {
        (Level::Error, "pingora_core::connectors")
            if text() == "failed to acquire reusable stream" =>
        {
            Level::Debug
        }
        (Level::Error, "pingora_core::services::listening") => {
            let text = text();
            if !text.starts_with("Downstream handshake") {
                level
            } else if text.contains("handshake eof") || text.contains("reset by peer") {
                Level::Debug
            } else {
                Level::Warn
            }
        }
        (Level::Error, "pingora_proxy") => {
            let head_cut_short = text()
                .strip_prefix("Fail to proxy: Downstream ")
                .is_some_and(|t| {
                    (t.starts_with("ConnectionClosed") || t.starts_with("ReadError"))
                        && t.contains("while reading request headers")
                });
            if head_cut_short { Level::Debug } else { level }
        }
        (Level::Warn, "rustls::msgs::handshake") if text().starts_with("Illegal SNI") => {
            Level::Debug
        }
        (Level::Warn | Level::Info, "redis::cluster_handling::async_connection") => {
            let text = text();
            if text.starts_with("Failed to connect to node")
                || text.starts_with("async cluster client recovery")
            {
                Level::Debug
            } else {
                level
            }
        }
        _ => level,
    }
}

/// env_logger, with the levels of [`level_for`].
struct Logger(env_logger::Logger);

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        self.0.enabled(metadata)
    }

    fn log(&self, record: &Record) {
        let level = level_for(record);
        let as_logged = |args| {
            Record::builder()
                .args(args)
                .level(level)
                .target(record.target())
                .module_path(record.module_path())
                .file(record.file())
                .line(record.line())
                .build()
        };
        // The access log is built from fields that hold no credential, one line a request: it
        // is written as it is.
        if record.target() == ACCESS || !self.0.matches(&as_logged(*record.args())) {
            return self.0.log(&as_logged(*record.args()));
        }
        let text = match record.args().as_str() {
            Some(text) => Cow::Borrowed(text),
            None => Cow::Owned(record.args().to_string()),
        };
        let redacted = redact(&text);
        self.0.log(&as_logged(format_args!("{redacted}")));
    }

    fn flush(&self) {
        self.0.flush();
    }
}

/// Sets up the log for the process, once, first in `main`.
pub fn init() {
    let logger =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(DEFAULT_LOG))
            .build();
    let max = logger.filter();
    log::set_boxed_logger(Box::new(Logger(logger))).expect("the log is set up once");
    log::set_max_level(max);
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What a logger wrote.
    #[derive(Clone, Default)]
    struct Written(Arc<Mutex<Vec<u8>>>);

    impl Write for Written {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Logs each (level, target, message) through our logger built with `filters`; returns
    /// what it wrote.
    fn written_with(filters: &str, records: &[(Level, &str, &str)]) -> String {
        let written = Written::default();
        let logger = Logger(
            env_logger::Builder::new()
                .parse_filters(filters)
                .target(env_logger::Target::Pipe(Box::new(written.clone())))
                .build(),
        );
        for (level, target, message) in records {
            logger.log(
                &Record::builder()
                    .args(format_args!("{message}"))
                    .level(*level)
                    .target(target)
                    .build(),
            );
        }
        String::from_utf8(written.0.lock().unwrap().clone()).unwrap()
    }

    const LISTENING: &str = "pingora_core::services::listening";

    /// Lines as pingora and rustls log them, and others of the same targets.
    const REDIS_CLUSTER: &str = "redis::cluster_handling::async_connection";

    const RECORDS: [(Level, &str, &str); 12] = [
        (
            Level::Error,
            "pingora_proxy",
            "Fail to proxy: Downstream ConnectionClosed context: while reading request headers, bytes already read: 32, downstream session type: h1",
        ),
        (
            Level::Error,
            "pingora_proxy",
            "Fail to proxy: Downstream ReadError context: while reading request headers cause: Connection reset by peer (os error 104), downstream session type: h1",
        ),
        (
            Level::Error,
            "pingora_proxy",
            "Fail to proxy: Upstream ConnectTimedout context: while connecting, status: 502, tries: 1, retry: false, GET /v1/pets, Host: x",
        ),
        (
            Level::Error,
            "pingora_core::connectors",
            "failed to acquire reusable stream",
        ),
        (Level::Error, "pingora_core::connectors", "other"),
        (
            Level::Error,
            LISTENING,
            "Downstream handshake error from 127.0.0.1:1:  TLSHandshakeFailure context: tls connect error: tls handshake eof",
        ),
        (
            Level::Error,
            LISTENING,
            "Downstream handshake error from 127.0.0.1:2:  TLSHandshakeFailure context: received fatal alert: UnknownCA",
        ),
        (
            Level::Error,
            LISTENING,
            "Accept() failed Too many open files",
        ),
        (
            Level::Warn,
            "rustls::msgs::handshake",
            "Illegal SNI extension: ignoring IP address presented as hostname (3132372e302e302e31)",
        ),
        (
            Level::Warn,
            REDIS_CLUSTER,
            "ClusterConnInner: connection to 127.0.0.1:17006 lost; repairing in background",
        ),
        (
            Level::Warn,
            REDIS_CLUSTER,
            "Failed to connect to node: 127.0.0.1:17006, due to: Connection refused (os error 111)",
        ),
        (
            Level::Info,
            REDIS_CLUSTER,
            "async cluster client recovery: slot refresh complete",
        ),
    ];

    #[test]
    fn what_clients_do_is_logged_below_the_faults() {
        let info = written_with(DEFAULT_LOG, &RECORDS);
        let lines: Vec<&str> = info.lines().collect();
        assert_eq!(lines.len(), 5, "{info}");
        assert!(
            lines[0].contains("ERROR pingora_proxy] Fail to proxy: Upstream ConnectTimedout"),
            "{info}"
        );
        assert!(
            lines[1].contains("ERROR pingora_core::connectors] other"),
            "{info}"
        );
        assert!(lines[2].contains("WARN  pingora_core::services::listening] Downstream handshake error from 127.0.0.1:2"), "{info}");
        assert!(
            lines[3].contains("ERROR pingora_core::services::listening] Accept() failed"),
            "{info}"
        );
        assert!(
            lines[4].contains("WARN  redis::cluster_handling::async_connection] ClusterConnInner"),
            "{info}"
        );

        let debug = written_with("debug", &RECORDS);
        assert_eq!(debug.lines().count(), RECORDS.len(), "{debug}");
        for demoted in [
            "bytes already read: 32",
            "Connection reset by peer (os error 104)",
            "reusable stream",
            "127.0.0.1:1",
            "Illegal SNI",
            "Failed to connect to node",
            "slot refresh complete",
        ] {
            assert!(
                debug
                    .lines()
                    .any(|l| l.contains("DEBUG") && l.contains(demoted)),
                "{demoted} at debug: {debug}"
            );
        }
    }
}
