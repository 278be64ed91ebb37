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
        serde_json::Value::String(s) => printable(s),
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

/// `text` with control characters escaped (`\t`, `\n`, `\u{1b}`): a name stored before names
/// were checked cannot split a row or reach the terminal.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Unix seconds as RFC 3339 UTC, to the second (last use is recorded to the minute); beyond
/// year 9999, which RFC 3339 cannot write, the Unix seconds.
fn timestamp(unix: u64) -> String {
    use std::fmt::Write;
    let mut text = String::new();
    match std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_secs(unix)) {
        Some(time) if write!(text, "{}", humantime::format_rfc3339_seconds(time)).is_ok() => text,
        _ => unix.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_store_holds_is_listed_whatever_it_is() {
        assert_eq!(timestamp(1_795_342_730), "2026-11-22T10:18:50Z");
        assert_eq!(timestamp(253_402_300_800), "253402300800", "year 10000");
        assert_eq!(timestamp(u64::MAX), u64::MAX.to_string());
        assert_eq!(printable("a\tb\nc\u{1b}[31m é'"), "a\\tb\\nc\\u{1b}[31m é'");
    }
}
