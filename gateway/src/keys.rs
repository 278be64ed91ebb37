//! API keys: their format, their records, and what creating, rotating and revoking does to a
//! set of records (stored by [`crate::key_store`] or in Redis by [`crate::redis_keys`]); the
//! usable ones as the gateway holds them in memory are [`crate::key_set`].
//!
//! A key reads `as_<id>_<secret>`: `id` is 16 hex digits (64 random bits) and safe to log; the
//! secret is 64 hex digits (256 random bits). Only the SHA-256 of the whole key is stored, and
//! the comparison is constant-time. With 256 bits of entropy a salted slow hash adds nothing: no
//! one can enumerate the key space.

use std::path::PathBuf;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::plans::Plans;

pub(crate) const PREFIX: &str = "as_";
pub(crate) const ID_BYTES: usize = 8;
const SECRET_BYTES: usize = 32;

/// Why a key operation failed.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The store file could not be read or written.
    #[error("key store {path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why: part of the message, not a source, so that it is printed once.
        error: std::io::Error,
    },
    /// The store file is not what we write.
    #[error("key store {path} is damaged: {message}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What does not parse.
        message: String,
    },
    /// No key has this id (or this key).
    #[error("no key {0}")]
    NotFound(String),
    /// The plan is unknown or incomplete without overrides.
    #[error("{0}")]
    Plan(String),
    /// The operating system's random source failed.
    #[error("no randomness available: {0}")]
    Random(String),
    /// The shared key store in Redis could not be used.
    #[error("key store in redis: {0}")]
    Redis(String),
    /// A name or duration given for a key cannot be used.
    #[error("{0}")]
    Invalid(String),
}

/// A key's public id: 64 random bits, shown as 16 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub u64);

impl std::fmt::Display for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl KeyId {
    /// Parses 16 lowercase or uppercase hex digits, in one pass over them with no early return:
    /// this runs on every key presented.
    pub fn parse(s: &str) -> Option<KeyId> {
        let digits: &[u8; ID_BYTES * 2] = s.as_bytes().try_into().ok()?;
        let (value, ok) = digits.iter().fold((0u64, true), |(value, ok), &b| {
            // A hex digit's value is its low four bits, plus 9 for a letter: letters are the
            // only hex digits with bit 6 set (`a` is 0x61, `A` 0x41, `0` 0x30).
            let digit = (b & 0xf) + 9 * (b >> 6);
            (value << 4 | u64::from(digit), ok & b.is_ascii_hexdigit())
        });
        ok.then_some(KeyId(value))
    }
}

/// Whether every byte of `s` is a hex digit. Every byte is looked at, with no early return, so
/// that the compiler checks many at once: this runs on every key presented.
fn all_hex(s: &str) -> bool {
    s.bytes().fold(true, |ok, b| ok & b.is_ascii_hexdigit())
}

/// The id part of a well-formed key, or `None` when the text cannot be one of ours.
pub fn id_of_key(key: &str) -> Option<KeyId> {
    let rest = key.strip_prefix(PREFIX)?;
    // The id has a fixed length: the `_` after it is found without a search.
    let (id, rest) = rest.split_at_checked(ID_BYTES * 2)?;
    let secret = rest.strip_prefix('_')?;
    (secret.len() == SECRET_BYTES * 2 && all_hex(secret))
        .then(|| KeyId::parse(id))
        .flatten()
}

/// SHA-256 of the key, as stored.
pub fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// A new random key and its id.
pub fn generate() -> Result<(KeyId, String), KeyError> {
    let mut bytes = [0u8; ID_BYTES + SECRET_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| KeyError::Random(e.to_string()))?;
    let id = KeyId(u64::from_be_bytes(
        bytes[..ID_BYTES].try_into().expect("8 bytes"),
    ));
    let key = format!("{PREFIX}{id}_{}", hex::encode(&bytes[ID_BYTES..]));
    Ok((id, key))
}

/// What a new key is to be: `keys create`'s arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewKey {
    /// The plan's name.
    pub plan: String,
    /// A label for people.
    pub name: Option<String>,
    /// Overrides of the plan's limits (required for `enterprise`).
    pub per_minute: Option<u64>,
    /// See `per_minute`.
    pub per_day: Option<u64>,
    /// How long the key is valid; forever if none.
    pub expires_in: Option<std::time::Duration>,
}

impl NewKey {
    /// A key on `plan` with its limits, no name and no expiry.
    pub fn on(plan: &str) -> NewKey {
        NewKey {
            plan: plan.to_owned(),
            ..NewKey::default()
        }
    }
}

/// The longest `--expires-in` or `--overlap`: 100 years. Dates beyond year 9999 cannot be
/// written in RFC 3339, as `keys list` does.
const LONGEST: std::time::Duration = std::time::Duration::from_secs(36_500 * 86_400);

/// The longest name, in characters.
const NAME_CHARS: usize = 100;

/// `duration` of `flag` in whole seconds, if it is at least `shortest` and at most [`LONGEST`].
fn seconds(flag: &str, duration: std::time::Duration, shortest: u64) -> Result<u64, KeyError> {
    let secs = duration.as_secs();
    if secs < shortest || duration > LONGEST {
        return Err(KeyError::Invalid(format!(
            "{flag} must be from {shortest}s to 36500d (100 years), not {}",
            in_largest_unit(duration)
        )));
    }
    Ok(secs)
}

/// `duration` in the largest of days, hours, minutes and seconds that it is a whole number of,
/// as it was most likely typed: `1000000d`, not humantime's `2737years 10months 6days 8h 24m`.
fn in_largest_unit(duration: std::time::Duration) -> String {
    if duration.subsec_nanos() != 0 {
        return humantime::format_duration(duration).to_string();
    }
    let secs = duration.as_secs();
    match [(86_400, 'd'), (3_600, 'h'), (60, 'm')]
        .into_iter()
        .find(|(unit, _)| secs != 0 && secs.is_multiple_of(*unit))
    {
        Some((unit, name)) => format!("{}{name}", secs / unit),
        None => format!("{secs}s"),
    }
}

/// A name shows in `keys list`, one line per key with tab-separated fields: it is 1 to 100
/// characters with no control characters (tab, newline, terminal escapes).
fn check_name(name: &str) -> Result<(), KeyError> {
    let chars = name.chars().count();
    if chars == 0 || chars > NAME_CHARS || name.chars().any(char::is_control) {
        return Err(KeyError::Invalid(format!(
            "--name must be 1 to {NAME_CHARS} characters without tabs, newlines or other control characters"
        )));
    }
    Ok(())
}

/// A new key as `new` asks, and its record (which holds only its hash).
pub fn new_key(plans: &Plans, new: NewKey) -> Result<(KeyRecord, String), KeyError> {
    plans
        .resolve(&new.plan, new.per_minute, new.per_day)
        .map_err(KeyError::Plan)?;
    if let Some(name) = &new.name {
        check_name(name)?;
    }
    let lifetime = new
        .expires_in
        .map(|d| seconds("--expires-in", d, 1))
        .transpose()?;
    let (id, key) = generate()?;
    let record = KeyRecord {
        id: id.to_string(),
        name: new.name,
        plan: new.plan,
        per_minute: new.per_minute,
        per_day: new.per_day,
        sha256: hex::encode(hash_key(&key)),
        created: unix_now(),
        revoked: None,
        expires: lifetime.map(|secs| unix_now() + secs),
        successor: None,
        counters: None,
    };
    Ok((record, key))
}

/// Issues the successor of the usable key named by an id or by the key itself: same name, plan
/// and limits, sharing its counters; the old key keeps working for `overlap`, then expires.
/// A key whose successor was revoked (it leaked, or was never shown) may be rotated again.
/// Returns the successor's record and key.
pub fn rotate_in(
    keys: &mut Vec<KeyRecord>,
    id_or_key: &str,
    overlap: std::time::Duration,
) -> Result<(KeyRecord, String), KeyError> {
    let overlap = seconds("--overlap", overlap, 0)?;
    let now = unix_now();
    let index = find_index(keys, id_or_key)?;
    let old = &keys[index];
    if !old.usable(now) {
        return Err(KeyError::NotFound(format!(
            "{} (revoked or expired)",
            old.id
        )));
    }
    if let Some(successor) = &old.successor
        && keys
            .iter()
            .any(|k| &k.id == successor && k.revoked.is_none())
    {
        return Err(KeyError::Plan(format!(
            "key {} was already rotated to {successor}; rotate that one",
            old.id
        )));
    }
    let (id, key) = generate()?;
    let record = KeyRecord {
        id: id.to_string(),
        name: old.name.clone(),
        plan: old.plan.clone(),
        per_minute: old.per_minute,
        per_day: old.per_day,
        sha256: hex::encode(hash_key(&key)),
        created: now,
        revoked: None,
        expires: old.expires,
        successor: None,
        counters: Some(old.counters.clone().unwrap_or_else(|| old.id.clone())),
    };
    let old = &mut keys[index];
    let end = now + overlap;
    old.expires = Some(old.expires.map_or(end, |e| e.min(end)));
    old.successor = Some(record.id.clone());
    keys.push(record.clone());
    Ok((record, key))
}

/// The index of the record named by an id or by the key itself.
fn find_index(keys: &[KeyRecord], id_or_key: &str) -> Result<usize, KeyError> {
    let (id, hash) = match id_of_key(id_or_key) {
        Some(id) => (id.to_string(), Some(hex::encode(hash_key(id_or_key)))),
        None => (id_or_key.to_ascii_lowercase(), None),
    };
    // Never echo a full key back, not even in an error.
    let shown = KeyId::parse(&id).map_or_else(|| "with that id".to_owned(), |id| id.to_string());
    keys.iter()
        .position(|r| r.id == id && hash.as_ref().is_none_or(|h| *h == r.sha256))
        .ok_or(KeyError::NotFound(shown))
}

/// Marks the record named by an id or by the key itself revoked; returns it.
pub fn revoke_in(keys: &mut [KeyRecord], id_or_key: &str) -> Result<KeyRecord, KeyError> {
    let index = find_index(keys, id_or_key)?;
    let record = &mut keys[index];
    record.revoked.get_or_insert_with(unix_now);
    Ok(record.clone())
}

/// One key as stored: never the key itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyRecord {
    /// The public id, 16 hex digits.
    pub id: String,
    /// A name to recognise the key by.
    pub name: Option<String>,
    /// The plan whose limits apply unless overridden.
    pub plan: String,
    /// Per-minute override.
    pub per_minute: Option<u64>,
    /// Per-day override.
    pub per_day: Option<u64>,
    /// SHA-256 of the key, hex.
    pub sha256: String,
    /// Unix seconds at creation.
    pub created: u64,
    /// Unix seconds at revocation, if revoked.
    pub revoked: Option<u64>,
    /// Unix seconds after which the key stops working, if it expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<u64>,
    /// The id of the key that replaced this one (`keys rotate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub successor: Option<String>,
    /// The id whose counters, quotas and bans this key shares: its first predecessor's, so a
    /// rotation never resets a limit. Absent: the key's own id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<String>,
}

impl KeyRecord {
    /// Whether the key is usable at `now` (Unix seconds): not revoked, not expired.
    pub fn usable(&self, now: u64) -> bool {
        self.revoked.is_none() && self.expires.is_none_or(|e| now < e)
    }
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests;
