//! The configuration file: its serde shape, and loading it with the command line's overrides.
//!
//! Each service crate owns its section's types and validation; this module only composes them,
//! so a typo, a wrong type or an out-of-range value fails at start with the line at fault.

use std::path::{Path, PathBuf};

use animal_store_backend::BackendConfig;
use animal_store_gateway::{GatewayConfig, Settings};
use serde::Deserialize;

use crate::cli::Overrides;

/// Default data directory, relative to where the binary is started.
pub const DEFAULT_DATA_DIR: &str = "data";

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// The backend's sled database, the key store and the gateway's limits live here.
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    /// `[backend]`: the pets service.
    #[serde(default)]
    pub backend: BackendConfig,
    /// `[gateway]`: the API gateway, its plans, bans and routes.
    #[serde(default)]
    pub gateway: GatewayConfig,
}

impl FileConfig {
    /// The gateway's validated settings; its `backend` upstream is where the backend listens.
    pub fn gateway_settings(&self) -> Result<Settings, String> {
        Settings::new(&self.gateway, self.backend.listen)
    }
}

fn default_data_dir() -> PathBuf {
    PathBuf::from(DEFAULT_DATA_DIR)
}

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {error}{hint}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why: part of the message, not a source, so that it is printed once.
        error: std::io::Error,
        /// For a relative path that is not there, the directory it was read from and how to
        /// name another file: the default, `config/animal-store.toml`, is found only from the
        /// directory that holds `config/` (such as the repository). Empty otherwise.
        hint: String,
    },
    /// The file is not valid TOML or does not fit the schema; the message names line and column.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong and where.
        message: String,
    },
}

/// Reads and validates `path`.
pub fn read(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
        path: path.to_owned(),
        hint: not_found_hint(path, &error),
        error,
    })?;
    parse(&text).map_err(|message| ConfigError::Invalid {
        path: path.to_owned(),
        message,
    })
}

/// For a relative `path` that is not there: the working directory it was read from, and the
/// flag that names another file.
fn not_found_hint(path: &Path, error: &std::io::Error) -> String {
    if path.is_absolute() || error.kind() != std::io::ErrorKind::NotFound {
        return String::new();
    }
    let dir = std::env::current_dir().map_or_else(|_| "?".to_owned(), |d| d.display().to_string());
    format!(
        "; a relative path is read from the working directory, here {dir}: name the file with --config FILE"
    )
}

/// Checks what the file names beyond itself: the TLS certificate, its key and the session ticket
/// keys (`check-config`). Returns the warnings a start would log for them: secret files every
/// user of the machine may read or write.
pub fn check_files(config: &FileConfig) -> anyhow::Result<Vec<String>> {
    use animal_store_gateway::tls;
    let settings = config.gateway_settings().map_err(anyhow::Error::msg)?;
    let key = match &settings.tls {
        Some((_, files)) => {
            tls::load(files, std::time::SystemTime::now())?;
            Some(files.key.as_path())
        }
        None => None,
    };
    // Checked also without a listener in the file, which the command line may give.
    let ticket_keys = &config.gateway.tls.ticket_keys;
    tls::check_ticket_keys(ticket_keys)?;
    Ok(tls::exposed_secrets(key, ticket_keys))
}

/// Parses configuration text; errors say the line and column.
pub fn parse(text: &str) -> Result<FileConfig, String> {
    let config: FileConfig = toml::from_str(text).map_err(|e| describe(text, &e))?;
    // What spans several keys is checked after parsing; the message names the key path.
    config.gateway_settings()?;
    Ok(config)
}

/// Renders a TOML error as `line L, column C: message` for a one-line log entry.
fn describe(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim_end();
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: {message}")
        }
        None => message.to_owned(),
    }
}

/// Loads the file named by `--config` and applies the command line's overrides. A Redis
/// password in a file every user may read is logged as a warning ([`exposed_password`]).
pub fn load(overrides: &Overrides) -> Result<FileConfig, ConfigError> {
    let mut config = read(&overrides.config)?;
    if let Some(warning) = exposed_password(&overrides.config, &config) {
        log::warn!("{warning}");
    }
    apply(overrides, &mut config, &overrides.config)?;
    Ok(config)
}

/// The warning for a configuration file, `config` as read from `path` (before the command
/// line's overrides), whose `gateway.redis.url` carries a password while every user of the
/// machine may read the file; None otherwise.
pub fn exposed_password(path: &Path, config: &FileConfig) -> Option<String> {
    let urls = config.gateway.redis.url.as_deref()?;
    if !animal_store_gateway::redis_conn::has_password(urls) {
        return None;
    }
    let warning = animal_store_gateway::secret_files::open_to_others(
        path,
        "a Redis password (gateway.redis.url)",
    )?;
    Some(format!(
        "{warning}; or give the URL in {}, which keeps it out of the file",
        crate::cli::REDIS_URL_ENV
    ))
}

/// Puts the command line's overrides (flags, and the environment's Redis URL) over `config`,
/// read from `path`: what a start with them would run, which `check-config` checks too. Then
/// checks what only the two together decide: that no two listeners share an address.
pub fn apply(
    overrides: &Overrides,
    config: &mut FileConfig,
    path: &Path,
) -> Result<(), ConfigError> {
    put_over(overrides, config);
    animal_store_gateway::settings::distinct_listeners(&config.gateway, config.backend.listen)
        .map_err(|message| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        })
}

/// The flags' values in place of the file's.
fn put_over(overrides: &Overrides, config: &mut FileConfig) {
    if let Some(dir) = &overrides.data_dir {
        config.data_dir = dir.clone();
    }
    if let Some(addr) = overrides.backend_listen {
        config.backend.listen = addr;
    }
    if let Some(addr) = overrides.listen {
        config.gateway.listen = addr;
    }
    if let Some(addr) = overrides.admin_listen {
        config.gateway.admin_listen = addr;
    }
    if let Some(url) = &overrides.redis_url {
        config.gateway.redis.url = Some(url.clone());
    }
    let tls = &mut config.gateway.tls;
    tls.listen = overrides.tls_listen.or(tls.listen);
    tls.cert = overrides.tls_cert.clone().or(tls.cert.take());
    tls.key = overrides.tls_key.clone().or(tls.key.take());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_configuration_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/animal-store.toml");
        read(&path).expect("the shipped configuration is valid");
    }

    #[test]
    fn errors_name_the_line() {
        let err = parse("data_dir = \"d\"\n[backend]\nmax_body_bytes = -1\n").unwrap_err();
        assert!(err.starts_with("line 3"), "{err}");
        let err = parse("[backend]\nlisten = \"127.0.0.1:1\"\nlistne = 3\n").unwrap_err();
        assert!(err.starts_with("line 3") && err.contains("listne"), "{err}");
    }
}
