//! The `animal-store` binary: parses the command line, loads the configuration, and runs the
//! command. Everything else lives in the library crates.

mod cli;
mod config;
mod run;

use clap::Parser;

use cli::{Cli, Command};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Serve);
    if let Command::CheckConfig { file } = &command {
        let path = file.as_ref().unwrap_or(&cli.overrides.config);
        config::read(path)?;
        println!("{}: ok", path.display());
        return Ok(());
    }
    let config = config::load(&cli.overrides)?;
    match command {
        Command::Serve | Command::Backend => run::backend(&config),
        Command::Gateway | Command::Keys(_) => anyhow::bail!("not built yet"),
        Command::CheckConfig { .. } => unreachable!("handled above"),
    }
}
