//! `animal-store keys`: issue, list and revoke API keys in the key store: the data directory's
//! file, or Redis with `--redis-url`. A running gateway picks the change up within its
//! `key_refresh_ms`.

use crate::cli::KeysCommand;
use crate::config::FileConfig;

/// Runs one `keys` subcommand.
pub fn run(command: KeysCommand, config: &FileConfig) -> anyhow::Result<()> {
    let settings = config.gateway_settings().map_err(anyhow::Error::msg)?;
    let store = animal_store_gateway::key_source(&settings, &config.data_dir)?;
    let plans = &config.gateway.plans;
    match command {
        KeysCommand::Create {
            plan,
            name,
            per_minute,
            per_day,
        } => {
            let (record, key) =
                store.blocking(store.create(plans, &plan, name, per_minute, per_day))?;
            eprintln!(
                "issued key {} on plan {}; it is shown only this once",
                record.id, record.plan
            );
            println!("{key}");
        }
        KeysCommand::List => {
            for r in store.blocking(store.load())? {
                let limits = plans.resolve(&r.plan, r.per_minute, r.per_day);
                let (per_minute, per_day) = match limits {
                    Ok(l) => (l.per_minute.to_string(), l.per_day.to_string()),
                    Err(_) => ("?".to_owned(), "?".to_owned()),
                };
                println!(
                    "{}\tname={}\tplan={}\tper_minute={per_minute}\tper_day={per_day}\tcreated={}\trevoked={}",
                    r.id,
                    r.name.as_deref().unwrap_or("-"),
                    r.plan,
                    timestamp(r.created),
                    r.revoked.map_or_else(|| "-".to_owned(), timestamp),
                );
            }
        }
        KeysCommand::Revoke { id_or_key } => {
            let record = store.blocking(store.revoke(&id_or_key))?;
            println!("revoked key {}", record.id);
        }
    }
    Ok(())
}

fn timestamp(unix: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix))
        .to_string()
}
