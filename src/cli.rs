//! The command line: one `animal-store` binary, its commands and the flags that override the
//! configuration file. Doc comments here are the `--help` text.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// The environment variable `--redis-url` may come from instead (the flag wins).
pub const REDIS_URL_ENV: &str = "ANIMAL_STORE_REDIS_URL";

/// Animal Store: the pets service and its API gateway.
///
/// With no command, runs the backend and the gateway together (`serve`).
#[derive(Debug, Parser)]
#[command(name = "animal-store", version)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Flags that override the configuration file.
    #[command(flatten)]
    pub overrides: Overrides,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the backend and the gateway together (the default).
    Serve,
    /// Run the backend alone.
    Backend,
    /// Run the gateway alone.
    Gateway,
    /// Issue, list and revoke API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Validate a configuration file and say what is wrong, with the line; with flags (such as
    /// --tls-cert and --tls-key), the configuration they make of it, files checked as at start.
    CheckConfig {
        /// The file to check; defaults to --config.
        file: Option<PathBuf>,
    },
}

/// `keys` subcommands.
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Issue a key and print it, alone, on stdout. It is shown only this once.
    Create {
        /// Plan: free, pro, business or enterprise.
        #[arg(long)]
        plan: String,
        /// A name to recognise the key by in `keys list`.
        #[arg(long)]
        name: Option<String>,
        /// Requests per minute, overriding the plan (required for enterprise).
        #[arg(long)]
        per_minute: Option<u64>,
        /// Requests per UTC day, overriding the plan (required for enterprise).
        #[arg(long)]
        per_day: Option<u64>,
        /// The key stops working after this long (`90d`, `12h`, `30m`).
        #[arg(long, value_parser = humantime::parse_duration)]
        expires_in: Option<std::time::Duration>,
    },
    /// Issue a successor key, printed alone on stdout; the old key keeps working for the
    /// overlap, then stops. Both share one set of counters, quotas and bans.
    Rotate {
        /// The key id (as in `keys list`) or the full key.
        id_or_key: String,
        /// How long the old key keeps working beside the new one.
        #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
        overlap: std::time::Duration,
    },
    /// One line per key: id, name, plan, limits, created, expires, last used (to the minute),
    /// revoked, successor. Never the key.
    List {
        /// One JSON array of objects instead, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key, by its id or by the key itself.
    Revoke {
        /// The key id (as in `keys list`) or the full key.
        id_or_key: String,
    },
}

/// Flags accepted by every command where they apply; each overrides the configuration file.
#[derive(Debug, Clone, Args)]
pub struct Overrides {
    /// The configuration file.
    #[arg(long, global = true, default_value = "config/animal-store.toml")]
    pub config: PathBuf,
    /// Where the backend's sled database, the key store and the gateway's limits live [default: data].
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
    /// The gateway's public listener (/v1/...) [default: 127.0.0.1:8080].
    #[arg(long, global = true)]
    pub listen: Option<SocketAddr>,
    /// Where the backend listens; the gateway's `backend` upstream points here [default: 127.0.0.1:8081].
    #[arg(long, global = true)]
    pub backend_listen: Option<SocketAddr>,
    /// The admin listener: /metrics, /healthz, /readyz [default: 127.0.0.1:9090].
    #[arg(long, global = true)]
    pub admin_listen: Option<SocketAddr>,
    /// Share keys, counts, quotas and bans with other gateways through Redis:
    /// redis://host:port[/db], or several cluster nodes separated by commas [default: none,
    /// state stays in the data directory]. From the environment, a password in it stays out of
    /// the process list and the configuration file.
    #[arg(long, global = true, env = REDIS_URL_ENV, hide_env_values = true)]
    pub redis_url: Option<String>,
    /// Also serve HTTPS (HTTP/2 and HTTP/1.1 by ALPN) here; needs --tls-cert and --tls-key.
    #[arg(long, global = true)]
    pub tls_listen: Option<SocketAddr>,
    /// PEM certificate chain (leaf first) for --tls-listen.
    #[arg(long, global = true)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the certificate for --tls-listen.
    #[arg(long, global = true)]
    pub tls_key: Option<PathBuf>,
}
