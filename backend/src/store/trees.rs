//! The sled layout of the store: what a create writes, in which order, and how pages are read.
//!
//! Tree `pets` maps the id (8 bytes, big-endian, so byte order is id order) to the pet's JSON;
//! tree `pets_by_status` holds `[status byte][id]` keys so a filtered page is one range scan.
//! Tree `idempotency` maps a client's idempotency key (scoped to the API key that sent it) to the
//! request it stood for and the pet it created.
//!
//! A create writes single keys in order, idempotency record, index entry, pet, and no sled
//! transaction: each transaction made sled write and sync two tiny log buffers of its own, which
//! capped durable creates at a quarter of what the disk does. sled recovers a prefix of its log,
//! so a crash mid-create leaves a record without its pet (a retry with the key writes the pet
//! the record describes) or an index entry without its pet (listing skips it). The record is
//! claimed with a compare-and-swap, so two concurrent creates with the same idempotency key
//! create one pet.

use std::fs::File;
use std::path::Path;

use super::{Created, DB_DIR, IDEMPOTENCY_TTL_SECS, IdempotencyKey};
use crate::errors::StoreError;
use crate::models::{ListQuery, NewPet, Pet, PetStatus};

/// The file in sled's directory that holds its log, where every write lands.
const SLED_LOG_FILE: &str = "db";

/// One opened sled database and its trees.
pub(super) struct Trees {
    db: sled::Db,
    /// sled's log file, opened again: see [`Trees::make_durable`].
    log: File,
    pets: sled::Tree,
    by_status: sled::Tree,
    idempotency: sled::Tree,
}

impl Trees {
    pub(super) fn open(data_dir: &Path) -> Result<Trees, StoreError> {
        let dir = data_dir.join(DB_DIR);
        let db = sled::Config::new()
            .path(&dir)
            .cache_capacity(CACHE_BYTES)
            .open()?;
        let log = File::open(dir.join(SLED_LOG_FILE)).map_err(sled::Error::Io)?;
        // The names of sled's files, which a new database has just made, must outlive a crash
        // as much as what is written in them.
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(sled::Error::Io)?;
        Ok(Trees {
            log,
            pets: db.open_tree("pets")?,
            by_status: db.open_tree("pets_by_status")?,
            idempotency: db.open_tree("idempotency")?,
            db,
        })
    }

    /// Makes every write made so far durable. sled's `flush` writes its log and waits for it
    /// with `sync_file_range` on Linux, which asks the disk for neither its volatile write
    /// cache nor the file's metadata: a power cut could still lose what it returned for, up to
    /// sled's own `fsync` every 500 ms. `sync_data` on the log file does both.
    pub(super) fn make_durable(&self) -> sled::Result<()> {
        self.db.flush()?;
        Ok(self.log.sync_data()?)
    }
}

/// What the idempotency tree remembers of a create.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct IdempotencyRecord {
    name: String,
    category_id: i64,
    status: PetStatus,
    pet_id: i64,
    created: u64,
}

impl IdempotencyRecord {
    /// The pet this create made.
    fn pet(&self) -> Pet {
        Pet {
            id: self.pet_id,
            name: self.name.clone(),
            category_id: self.category_id,
            status: self.status,
        }
    }

    fn same_request(&self, other: &IdempotencyRecord) -> bool {
        self.name == other.name
            && self.category_id == other.category_id
            && self.status == other.status
    }
}

/// sled's page cache; the catalogue is small, so keep its memory modest.
const CACHE_BYTES: u64 = 64 * 1024 * 1024;
impl Trees {
    pub(super) fn purge_expired_idempotency(&self, now_unix: u64) -> Result<usize, StoreError> {
        let mut purged = 0;
        for entry in self.idempotency.iter() {
            let (key, value) = entry?;
            let created =
                serde_json::from_slice::<IdempotencyRecord>(&value).map_or(0, |r| r.created);
            if now_unix.saturating_sub(created) >= IDEMPOTENCY_TTL_SECS {
                // Only if unchanged: a concurrent create may have just renewed this key.
                if self
                    .idempotency
                    .compare_and_swap(&key, Some(&value), None::<&[u8]>)?
                    .is_ok()
                {
                    purged += 1;
                }
            }
        }
        Ok(purged)
    }

    pub(super) fn insert(
        &self,
        new: NewPet,
        idempotency: Option<IdempotencyKey>,
        now_unix: u64,
    ) -> Result<Created, StoreError> {
        let Some(key) = idempotency.map(|k| k.storage_key()) else {
            let pet = Pet::from_new(self.next_id()?, new);
            self.write_pet(&pet)?;
            return Ok(Created::New(pet));
        };
        let mut remembered = IdempotencyRecord {
            name: new.name,
            category_id: new.category_id,
            status: new.status,
            pet_id: 0,
            created: now_unix,
        };
        loop {
            let current = self.idempotency.get(&key)?;
            if let Some(bytes) = &current {
                let earlier: IdempotencyRecord = serde_json::from_slice(bytes)
                    .map_err(|source| StoreError::Corrupt { id: 0, source })?;
                if now_unix.saturating_sub(earlier.created) < IDEMPOTENCY_TTL_SECS {
                    if !earlier.same_request(&remembered) {
                        return Ok(Created::KeyReused);
                    }
                    // The request that wrote the record may still be writing its pet, or the
                    // process stopped in between: the record says what the pet is, so write it.
                    let pet = match self.get(earlier.pet_id)? {
                        Some(pet) => pet,
                        None => {
                            let pet = earlier.pet();
                            self.write_pet(&pet)?;
                            pet
                        }
                    };
                    return Ok(Created::Replayed(pet));
                }
            }
            // New, or expired: claim the key, unless another create changed it meanwhile.
            remembered.pet_id = self.next_id()?;
            let claim = serde_json::to_vec(&remembered).map_err(|source| StoreError::Corrupt {
                id: remembered.pet_id,
                source,
            })?;
            if self
                .idempotency
                .compare_and_swap(&key, current, Some(claim))?
                .is_ok()
            {
                let pet = remembered.pet();
                self.write_pet(&pet)?;
                return Ok(Created::New(pet));
            }
        }
    }

    /// sled ids start at 0 and are never reissued, even after a crash (they jump instead).
    pub(super) fn next_id(&self) -> Result<i64, StoreError> {
        i64::try_from(self.db.generate_id()? + 1).map_err(|_| StoreError::IdsExhausted)
    }

    /// Writes the status index entry, then the record. Single-key writes reach the log in this
    /// order and sled recovers a prefix of its log, so after a crash an index entry may lack its
    /// pet (listing skips it) but a pet never lacks its index entry.
    fn write_pet(&self, pet: &Pet) -> Result<(), StoreError> {
        let record =
            serde_json::to_vec(pet).map_err(|source| StoreError::Corrupt { id: pet.id, source })?;
        self.by_status.insert(status_key(pet.status, pet.id), &[])?;
        self.pets.insert(pet.id.to_be_bytes(), record)?;
        Ok(())
    }

    /// One pet by id, if it exists.
    pub(super) fn get(&self, id: i64) -> Result<Option<Pet>, StoreError> {
        self.pets
            .get(id.to_be_bytes())?
            .map(|bytes| decode(id, &bytes))
            .transpose()
    }

    /// A page of pets in id order after `query.after`, plus whether more remain.
    pub(super) fn list(&self, query: &ListQuery) -> Result<(Vec<Pet>, bool), StoreError> {
        let first_id = query.after.map_or(0, |after| after.saturating_add(1));
        let want = query.limit as usize;
        let mut page = Vec::with_capacity(want.min(32));
        let mut more = false;
        match query.status {
            None => {
                for entry in self.pets.range(first_id.to_be_bytes()..) {
                    let (key, value) = entry?;
                    if page.len() == want {
                        more = true;
                        break;
                    }
                    page.push(decode(id_of(&key), &value)?);
                }
            }
            Some(status) => {
                let start = status_key(status, first_id);
                let prefix = [status as u8];
                for entry in self.by_status.range(start..).keys() {
                    let key = entry?;
                    if !key.starts_with(&prefix) {
                        break;
                    }
                    // An entry without its pet is a create a crash interrupted (see `write_pet`).
                    let Some(pet) = self.get(id_of(&key[1..]))? else {
                        continue;
                    };
                    if page.len() == want {
                        more = true;
                        break;
                    }
                    page.push(pet);
                }
            }
        }
        Ok((page, more))
    }
}

fn status_key(status: PetStatus, id: i64) -> [u8; 9] {
    let mut key = [0u8; 9];
    key[0] = status as u8;
    key[1..].copy_from_slice(&id.to_be_bytes());
    key
}

fn id_of(key: &[u8]) -> i64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&key[..8]);
    i64::from_be_bytes(bytes)
}

fn decode(id: i64, bytes: &[u8]) -> Result<Pet, StoreError> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Corrupt { id, source })
}

#[cfg(test)]
mod tests;
