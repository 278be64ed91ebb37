//! The `animal-store` binary: parses the command line, loads the configuration, and runs the
//! command. Everything else lives in the library crates.

mod cli;
mod config;
mod keys;
mod logging;
mod output;
mod run;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};

/// mimalloc (`allocator/` says why through a crate of our own).
#[global_allocator]
static GLOBAL: animal_store_allocator::MiMalloc = animal_store_allocator::MiMalloc;

/// mimalloc's `purge_delay` option (its position in `mi_option_t`, which the sys crate does not
/// name).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long mimalloc keeps freed memory before giving it back to the system. Its default, 1 s,
/// is only acted on when the thread that freed the memory allocates or frees again, so a gateway
/// that goes quiet after a burst (say, 10,000 clients that each sent a request and now hold their
/// connections open) keeps the burst's memory: 67-69 MiB for `serve` in that case, 51-56 MiB at
/// 100 ms, with no measurable change in throughput (at 0, 9% fewer requests a second).
const PURGE_DELAY_MS: std::ffi::c_long = 100;

/// Sets mimalloc's options, unless the environment sets them (`MIMALLOC_PURGE_DELAY`).
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: mimalloc's options may be set at any time; this runs first in `main`, before
        // any other thread exists, as its documentation asks of `mi_option_set`.
        #[allow(unsafe_code)]
        unsafe {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS);
        }
    }
}

/// Raises the soft limit on open files to the hard limit, as Go's runtime does for every
/// program and nginx's `worker_rlimit_nofile` is set for: each client connection, upstream
/// connection and open file takes a descriptor, and the usual soft limit of 1,024 would have a
/// load test's connections refused, and the writes of keys and limits fail with them. The hard
/// limit, the administrator's, is left as it is.
fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            log::warn!("cannot read the limit on open files: {e}");
            return;
        }
    };
    if soft >= hard {
        return;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => log::info!("limit on open files raised from {soft} to {hard}"),
        Err(e) => log::warn!("limit on open files stays {soft}: cannot raise it to {hard}: {e}"),
    }
}

fn main() -> ExitCode {
    tune_allocator();
    logging::init();
    // Before pingora, which would install ring's, without the post-quantum key exchange.
    animal_store_gateway::tls::install_crypto_provider();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, each cause after a colon, and no backtrace whatever `RUST_BACKTRACE`
            // says: a user's mistake needs its message, not our stack.
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the command `cli` asks for.
fn run(cli: Cli) -> anyhow::Result<()> {
    let overrides = &cli.overrides;
    let command = cli.command.unwrap_or(Command::Serve);
    if matches!(
        command,
        Command::Serve | Command::Backend | Command::Gateway
    ) {
        raise_open_files_limit();
    }
    match command {
        Command::Serve => run::serve(&config::load(overrides)?, overrides),
        Command::Backend => run::backend(&config::load(overrides)?),
        Command::Gateway => run::gateway(&config::load(overrides)?, overrides),
        Command::Keys(keys) => keys::run(keys, &config::load(overrides)?),
        Command::CheckConfig { file } => {
            let path = file.as_ref().unwrap_or(&overrides.config);
            let mut config = config::read(path)?;
            let password = config::exposed_password(path, &config);
            // With flags, the configuration they make: a certificate given on the command line
            // is checked as a start would load it.
            config::apply(overrides, &mut config, path)?;
            for warning in password.into_iter().chain(config::check_files(&config)?) {
                eprintln!("warning: {warning}");
            }
            Ok(output::print(&format!("{}: ok", path.display()))?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option's position is mimalloc's, not named by the sys crate: read back, it must be
    /// the purge delay (1,000 ms by default, the only option with that default).
    #[test]
    #[allow(unsafe_code)]
    fn the_option_set_is_the_purge_delay() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        // SAFETY: reading an option; tests that set options run in other processes.
        let default = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(default, 1000);
    }
}
