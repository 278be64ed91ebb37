//! The keys the gateway accepts, as it holds them in memory: each usable record resolved against
//! the plans into an [`ActiveKey`], and the [`KeySet`] that finds the one a request presents.

use std::sync::Arc;

use subtle::ConstantTimeEq;

use crate::key_index::KeyIndex;
use crate::keys::{KeyId, KeyRecord, hash_key, id_of_key, unix_now};
use crate::plans::{Limits, Plans};

/// A usable key, as the gateway holds it in memory. In this order (`repr(C)`), so that what
/// every request reads first (the hash and expiry the lookup checks, then what the decision
/// and `touch` read) is in the first cache lines after the `Arc`'s counts.
#[derive(Debug)]
#[repr(C)]
pub struct ActiveKey {
    sha256: [u8; 32],
    /// Unix milliseconds after which the key stops working.
    pub expires_ms: Option<u64>,
    /// Public id.
    pub id: KeyId,
    /// The id whose counters this key shares (its own, or its first predecessor's).
    pub counters: KeyId,
    /// Effective limits (plan or override).
    pub limits: Limits,
    /// The last minute (Unix minutes) this process saw the key used; written to the store once
    /// a minute, never per request.
    pub last_used_minute: std::sync::atomic::AtomicU64,
    /// The plan's name, as forwarded upstream in `X-Api-Plan`.
    pub plan: http::HeaderValue,
    /// `RateLimit-Policy` for these limits, rendered once.
    pub policy: http::HeaderValue,
    /// The id as forwarded upstream in `X-Api-Key-Id`, rendered once.
    pub id_header: http::HeaderValue,
}

// The hash and expiry in the first 48 bytes, which with the `Arc`'s two counts before them are
// the allocation's first 64: what the lookup reads, kept together (Rust's own order put the hash
// at 176).
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(offset_of!(ActiveKey, sha256) + 32 <= 48);
    assert!(offset_of!(ActiveKey, expires_ms) + size_of::<Option<u64>>() <= 48);
};

impl ActiveKey {
    /// Whether the key has expired at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.expires_ms.is_some_and(|e| now_ms >= e)
    }

    /// Notes a use at `now_ms`, to the minute: one relaxed load per request, a store once a
    /// minute.
    pub fn touch(&self, now_ms: u64) {
        use std::sync::atomic::Ordering;
        let minute = now_ms / 60_000;
        if self.last_used_minute.load(Ordering::Relaxed) != minute {
            self.last_used_minute.store(minute, Ordering::Relaxed);
        }
    }
}

/// The keys the gateway accepts: unrevoked records whose plan resolves, indexed by id.
#[derive(Debug, Default)]
pub struct KeySet {
    by_id: KeyIndex<Arc<ActiveKey>>,
}

impl KeySet {
    /// Builds the set from records; keys that cannot be used are skipped with a warning that
    /// names the key id only.
    pub fn build(records: &[KeyRecord], plans: &Plans) -> KeySet {
        let mut by_id = Vec::with_capacity(records.len());
        let now = unix_now();
        for record in records.iter().filter(|r| r.usable(now)) {
            let Some(id) = KeyId::parse(&record.id) else {
                log::warn!("key store: skipping a record with a malformed id");
                continue;
            };
            let mut sha256 = [0u8; 32];
            if hex::decode_to_slice(&record.sha256, &mut sha256).is_err() {
                log::warn!("key store: skipping key {id}: malformed hash");
                continue;
            }
            match plans.resolve(&record.plan, record.per_minute, record.per_day) {
                Ok(limits) => {
                    let Ok(plan) = http::HeaderValue::from_str(&record.plan) else {
                        log::warn!(
                            "key store: skipping key {id}: its plan name is not header text"
                        );
                        continue;
                    };
                    let id_header =
                        http::HeaderValue::try_from(id.to_string()).expect("hex digits");
                    let counters = record
                        .counters
                        .as_deref()
                        .and_then(KeyId::parse)
                        .unwrap_or(id);
                    let key = ActiveKey {
                        id,
                        plan,
                        limits,
                        policy: crate::rate_headers::key_policy(limits),
                        id_header,
                        counters,
                        expires_ms: record.expires.map(|e| e * 1000),
                        last_used_minute: std::sync::atomic::AtomicU64::new(0),
                        sha256,
                    };
                    by_id.push((id, Arc::new(key)));
                }
                Err(why) => log::warn!("key store: skipping key {id}: {why}"),
            }
        }
        KeySet {
            by_id: KeyIndex::build(by_id),
        }
    }

    /// The key matching `presented`, compared in constant time; `None` if unknown or revoked.
    /// The presented key is hashed while the index's slot for its id is fetched from memory.
    pub fn find(&self, presented: &str) -> Option<&Arc<ActiveKey>> {
        let (key, hash) = self
            .by_id
            .get_meanwhile(id_of_key(presented)?, || hash_key(presented));
        let key = key?;
        bool::from(hash.ct_eq(&key.sha256)).then_some(key)
    }

    /// Every key, for carrying state (last use) into a rebuilt set.
    pub fn keys(&self) -> impl Iterator<Item = &Arc<ActiveKey>> {
        self.by_id.values()
    }

    /// The key with `id`, if usable.
    pub fn get(&self, id: KeyId) -> Option<&Arc<ActiveKey>> {
        self.by_id.get(id)
    }

    /// How many keys are usable.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether no key is usable.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}
