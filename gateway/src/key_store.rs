//! The key store file: one JSON file in the data directory, rewritten atomically (temporary
//! file, fsync, rename) under an exclusive lock, so concurrent `keys` commands cannot lose each
//! other's writes and a running gateway never reads a half-written file. It holds records only,
//! with the keys' hashes ([`crate::keys`]).

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::keys::{KeyError, KeyRecord, NewKey, new_key, revoke_in, rotate_in};
use crate::plans::Plans;

/// File name of the key store inside the data directory.
pub const KEYS_FILE: &str = "keys.json";
/// File name of the keys' last use, beside the key store: kept apart so that recording a use
/// never looks like a change of keys to a running gateway.
pub const LAST_USED_FILE: &str = "keys-last-used.json";

/// The file's shape.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreFile {
    version: u32,
    keys: Vec<KeyRecord>,
}

/// The key store file in a data directory.
#[derive(Debug, Clone)]
pub struct KeyStore {
    path: PathBuf,
}

impl KeyStore {
    /// The store in `data_dir` (the file need not exist yet).
    pub fn new(data_dir: &Path) -> KeyStore {
        KeyStore {
            path: data_dir.join(KEYS_FILE),
        }
    }

    /// A store in the file `path`.
    pub fn at(path: PathBuf) -> KeyStore {
        KeyStore { path }
    }

    /// Where the store lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every record, revoked ones included; empty when the file does not exist.
    pub fn load(&self) -> Result<Vec<KeyRecord>, KeyError> {
        Ok(self.load_existing()?.unwrap_or_default())
    }

    /// Every record, revoked ones included; `None` when the file does not exist, which for a
    /// copy of Redis's keys means there is no copy (an empty one is a copy of no keys).
    pub fn load_existing(&self) -> Result<Option<Vec<KeyRecord>>, KeyError> {
        let text = match fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(self.io(source)),
        };
        let file: StoreFile = serde_json::from_str(&text).map_err(|e| KeyError::Corrupt {
            path: self.path.clone(),
            message: e.to_string(),
        })?;
        Ok(Some(file.keys))
    }

    /// Issues a key as `new` asks; returns the record and the key, which is never stored and
    /// cannot be shown again.
    pub fn create(&self, plans: &Plans, new: NewKey) -> Result<(KeyRecord, String), KeyError> {
        let (record, key) = new_key(plans, new)?;
        self.update(|keys| {
            keys.push(record.clone());
            Ok(())
        })?;
        Ok((record, key))
    }

    /// Revokes by id or by the key itself; returns the revoked record.
    pub fn revoke(&self, id_or_key: &str) -> Result<KeyRecord, KeyError> {
        let mut revoked = None;
        self.update(|keys| {
            revoked = Some(revoke_in(keys, id_or_key)?);
            Ok(())
        })?;
        Ok(revoked.expect("set by the update"))
    }

    /// Issues the successor of a key (see [`rotate_in`]).
    pub fn rotate(
        &self,
        id_or_key: &str,
        overlap: std::time::Duration,
    ) -> Result<(KeyRecord, String), KeyError> {
        let mut rotated = None;
        self.update(|keys| {
            rotated = Some(rotate_in(keys, id_or_key, overlap)?);
            Ok(())
        })?;
        Ok(rotated.expect("set by the update"))
    }

    /// When each key was last used (Unix seconds, to the minute), from `keys-last-used.json`.
    pub fn last_used(&self) -> HashMap<String, u64> {
        fs::read(self.last_used_path())
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    /// Records uses (key id, Unix seconds), keeping the later of old and new.
    pub fn record_use(&self, uses: &[(String, u64)]) -> Result<(), KeyError> {
        let mut all = self.last_used();
        for (id, at) in uses {
            let entry = all.entry(id.clone()).or_insert(0);
            *entry = (*entry).max(*at);
        }
        let path = self.last_used_path();
        let tmp = path.with_extension("json.tmp");
        fs::write(&tmp, serde_json::to_vec(&all).expect("a map serializes"))
            .and_then(|()| fs::rename(&tmp, &path))
            .map_err(|e| self.io(e))
    }

    fn last_used_path(&self) -> PathBuf {
        self.path.with_file_name(LAST_USED_FILE)
    }

    /// Replaces every record (a local copy of another store's keys).
    pub fn replace_all(&self, records: Vec<KeyRecord>) -> Result<(), KeyError> {
        self.update(|keys| {
            *keys = records;
            Ok(())
        })
    }

    /// Read-modify-write under an exclusive lock, replacing the file atomically.
    fn update(
        &self,
        change: impl FnOnce(&mut Vec<KeyRecord>) -> Result<(), KeyError>,
    ) -> Result<(), KeyError> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(dir).map_err(|e| self.io(e))?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.path.with_extension("lock"))
            .map_err(|e| self.io(e))?;
        lock.lock().map_err(|e| self.io(e))?;
        let mut keys = self.load()?;
        change(&mut keys)?;
        let text =
            serde_json::to_vec_pretty(&StoreFile { version: 1, keys }).expect("records serialize");
        let tmp = self.path.with_extension("json.tmp");
        let mut file = File::create(&tmp).map_err(|e| self.io(e))?;
        file.write_all(&text)
            .and_then(|()| file.sync_all())
            .map_err(|e| self.io(e))?;
        fs::rename(&tmp, &self.path).map_err(|e| self.io(e))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| self.io(e))?;
        Ok(())
    }

    fn io(&self, error: std::io::Error) -> KeyError {
        KeyError::Io {
            path: self.path.clone(),
            error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key_set::KeySet;
    use crate::plans::Limits;

    fn plans() -> Plans {
        Plans::defaults()
    }

    #[test]
    fn create_find_revoke_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = KeyStore::new(dir.path());
        let (record, key) = store
            .create(
                &plans(),
                NewKey {
                    name: Some("ci".into()),
                    ..NewKey::on("free")
                },
            )
            .unwrap();
        let text = fs::read_to_string(store.path()).unwrap();
        assert!(!text.contains(&key), "the key itself is never stored");
        let set = KeySet::build(&store.load().unwrap(), &plans());
        let found = set.find(&key).expect("the new key is accepted");
        assert_eq!(found.id.to_string(), record.id);
        assert_eq!(
            found.limits,
            Limits {
                per_minute: 60,
                per_day: 1000
            }
        );
        // A key with the right id but another secret is refused.
        let forged = format!(
            "{}{}",
            &key[..key.len() - 1],
            if key.ends_with('0') { '1' } else { '0' }
        );
        assert!(set.find(&forged).is_none());

        store.revoke(&key).unwrap();
        assert!(
            KeySet::build(&store.load().unwrap(), &plans())
                .find(&key)
                .is_none()
        );
        assert!(matches!(
            store.revoke("0000000000000000"),
            Err(KeyError::NotFound(_))
        ));
    }

    #[test]
    fn enterprise_needs_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let store = KeyStore::new(dir.path());
        assert!(matches!(
            store.create(&plans(), NewKey::on("enterprise")),
            Err(KeyError::Plan(_))
        ));
        assert!(matches!(
            store.create(&plans(), NewKey::on("gold")),
            Err(KeyError::Plan(_))
        ));
        let (record, _) = store
            .create(
                &plans(),
                NewKey {
                    per_minute: Some(5000),
                    per_day: Some(1_000_000),
                    ..NewKey::on("enterprise")
                },
            )
            .unwrap();
        assert_eq!(record.per_minute, Some(5000));
    }
}
