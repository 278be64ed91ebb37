//! The process's log: env_logger, as `RUST_LOG` chooses (info by default), with one line of
//! pingora's that reports no failure turned down from error to debug.

use log::{Level, Log, Metadata, Record};

/// Logging unless `RUST_LOG` says otherwise: info. The access log (target `access`) is chosen by
/// `gateway.access_log`. warp's server logs as an error each connection that a client closed
/// with a request unfinished (after a load test, one line per connection it had open), and
/// nothing else at that level in the way the backend serves: those lines are left out.
const DEFAULT_LOG: &str = "info,warp::server=off";

/// pingora 0.9 logs this as an error when a request loses a race for an idle upstream
/// connection (`TransportConnector::reused_stream`: the connection's idle task, on another
/// thread, has let go of its lock but not yet of its reference, so `Arc::try_unwrap` fails).
/// Nothing fails: the request opens a new connection. Through `serve` on two cores under `wrk`
/// it came 204 times in 10 s (one request in a thousand), each an ERROR line for an operator to
/// chase; pingora's issue #201 asks the same of its level.
const POOL_RACE: (&str, &str) = (
    "pingora_core::connectors",
    "failed to acquire reusable stream",
);

/// env_logger, with [`POOL_RACE`] demoted to debug.
struct Logger(env_logger::Logger);

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        self.0.enabled(metadata)
    }

    fn log(&self, record: &Record) {
        let pool_race = record.level() == Level::Error
            && record.target() == POOL_RACE.0
            && record.args().as_str() == Some(POOL_RACE.1);
        if !pool_race {
            return self.0.log(record);
        }
        self.0.log(
            &Record::builder()
                .args(*record.args())
                .level(Level::Debug)
                .target(record.target())
                .module_path(record.module_path())
                .file(record.file())
                .line(record.line())
                .build(),
        );
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

    /// Logs pingora's line, and another error of the same target, through our logger built
    /// with `filters`; returns what it wrote.
    fn written_with(filters: &str) -> String {
        let written = Written::default();
        let logger = Logger(
            env_logger::Builder::new()
                .parse_filters(filters)
                .target(env_logger::Target::Pipe(Box::new(written.clone())))
                .build(),
        );
        for message in [
            format_args!("failed to acquire reusable stream"),
            format_args!("other"),
        ] {
            logger.log(
                &Record::builder()
                    .args(message)
                    .level(Level::Error)
                    .target("pingora_core::connectors")
                    .build(),
            );
        }
        String::from_utf8(written.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn pingoras_pool_race_is_logged_at_debug_and_other_errors_as_they_come() {
        let info = written_with(DEFAULT_LOG);
        assert!(!info.contains("reusable"), "{info}");
        assert!(
            info.contains("ERROR pingora_core::connectors] other"),
            "{info}"
        );

        let debug = written_with("debug");
        assert!(
            debug.contains("DEBUG pingora_core::connectors] failed to acquire reusable stream"),
            "{debug}"
        );
    }
}
