//! `animal-store keys`: issue, list and revoke API keys in the key store: the data directory's
//! file, or Redis with `--redis-url`. A running gateway picks the change up within its
//! `key_refresh_ms`.

use animal_store_gateway::NewKey;

use crate::cli::KeysCommand;
use crate::config::FileConfig;
use crate::output;

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
            expires_in,
        } => {
            let new = NewKey {
                plan,
                name,
                per_minute,
                per_day,
                expires_in,
            };
            let (record, key) = store.blocking(store.create(plans, new))?;
            output::print_key(&store, &record, &key)?;
            eprintln!(
                "issued key {} on plan {}; it is shown only this once",
                record.id, record.plan
            );
        }
        KeysCommand::Rotate { id_or_key, overlap } => {
            let (record, key) = store.blocking(store.rotate(&id_or_key, overlap))?;
            output::print_key(&store, &record, &key)?;
            eprintln!(
                "issued key {} to succeed the one given; it is shown only this once. The old key works for {} more",
                record.id,
                humantime::format_duration(overlap)
            );
        }
        KeysCommand::List { json } => {
            let records = store.blocking(store.load())?;
            let used = store.blocking(store.last_used()).unwrap_or_default();
            let rows: Vec<serde_json::Value> = records
                .iter()
                .map(|r| {
                    let limits = plans.resolve(&r.plan, r.per_minute, r.per_day).ok();
                    serde_json::json!({
                        "id": r.id,
                        "name": r.name,
                        "plan": r.plan,
                        "per_minute": limits.map(|l| l.per_minute),
                        "per_day": limits.map(|l| l.per_day),
                        "created": timestamp(r.created),
                        "expires": r.expires.map(timestamp),
                        "last_used": used.get(&r.id).copied().map(timestamp),
                        "revoked": r.revoked.map(timestamp),
                        "successor": r.successor,
                    })
                })
                .collect();
            let text = if json {
                serde_json::Value::Array(rows).to_string()
            } else {
                let lines: Vec<String> = rows.iter().map(tab_separated).collect();
                lines.join("\n")
            };
            if !text.is_empty() {
                output::print(&text)?;
            }
        }
        KeysCommand::Revoke { id_or_key } => {
            let record = store.blocking(store.revoke(&id_or_key))?;
            output::print(&format!("revoked key {}", record.id))?;
        }
    }
    Ok(())
}

/// One row of `keys list`: the id, then `field=value` pairs, `-` for none.
fn tab_separated(row: &serde_json::Value) -> String {
    let text = |field: &str| match &row[field] {
        serde_json::Value::Null => "-".to_owned(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    format!(
        "{}\tname={}\tplan={}\tper_minute={}\tper_day={}\tcreated={}\texpires={}\tlast_used={}\trevoked={}\tsuccessor={}",
        text("id"),
        text("name"),
        text("plan"),
        text("per_minute"),
        text("per_day"),
        text("created"),
        text("expires"),
        text("last_used"),
        text("revoked"),
        text("successor")
    )
}

/// Unix seconds as RFC 3339 UTC, to the second (last use is recorded to the minute).
fn timestamp(unix: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix))
        .to_string()
}
