//! The `animal-store` binary: parses the command line, loads the configuration, and runs the
//! command. Everything else lives in the library crates.

mod cli;
mod config;
mod keys;
mod run;

use clap::Parser;

use cli::{Cli, Command};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Logging unless `RUST_LOG` says otherwise: info. The access log (target `access`) is chosen by
/// `gateway.access_log`.
const DEFAULT_LOG: &str = "info";

fn main() -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(DEFAULT_LOG)).init();
    let cli = Cli::parse();
    let overrides = &cli.overrides;
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => run::serve(&config::load(overrides)?, overrides),
        Command::Backend => run::backend(&config::load(overrides)?),
        Command::Gateway => run::gateway(&config::load(overrides)?, overrides),
        Command::Keys(keys) => keys::run(keys, &config::load(overrides)?),
        Command::CheckConfig { file } => {
            let path = file.as_ref().unwrap_or(&overrides.config);
            config::check_files(&config::read(path)?)?;
            println!("{}: ok", path.display());
            Ok(())
        }
    }
}
