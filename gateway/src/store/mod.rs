//! Where the limiter's state lives: one interface, two stores, one behaviour.
//!
//! The decision itself is written once, in [`crate::limits::KeyState::check`] (and, for Redis,
//! in `limits.lua`, its only other copy). The stores differ only in where the state is kept:
//!
//! | store | state | survives | shared |
//! |---|---|---|---|
//! | [`EmbeddedStore`] (default) | this process's memory, snapshotted to the data directory every second and at shutdown | SIGTERM/SIGINT: everything; SIGKILL: all but the last second | no |
//! | [`RedisStore`] (`gateway.redis.url`) | one Redis hash per key, decided by a server-side script | everything Redis keeps | by every gateway on that Redis |
//!
//! `tests/limit_stores.rs` runs one table of cases against both.

pub mod embedded;
pub mod limits_file;
pub mod redis;
pub mod redis_reply;

pub use embedded::EmbeddedStore;
pub use redis::{Fallback, RedisStore};

use crate::bans::BanPolicy;
use crate::keys::KeyId;
use crate::limits::{Decision, Standing};
use crate::plans::Limits;

/// The store cannot decide and is configured to refuse (`gateway.redis.fallback = "deny"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unavailable;

/// The limit store a gateway runs with.
pub enum LimitStore {
    /// State in this process, persisted to the data directory.
    Embedded(EmbeddedStore),
    /// State in Redis, shared by every gateway using it.
    Redis(std::sync::Arc<RedisStore>),
}

impl LimitStore {
    /// Checks and, if admitted, counts one request of `key` at `now_ms` (Unix milliseconds).
    pub async fn check(
        &self,
        key: KeyId,
        limits: Limits,
        bans: &BanPolicy,
        now_ms: u64,
    ) -> Result<Decision, Unavailable> {
        match self {
            LimitStore::Embedded(store) => Ok(store.check(key, limits, bans, now_ms)),
            LimitStore::Redis(store) => store.check(key, limits, bans, now_ms).await,
        }
    }

    /// Where `key` stands at `now_ms`, counting nothing (`GET /v1/rate_limit`).
    pub async fn peek(
        &self,
        key: KeyId,
        limits: Limits,
        now_ms: u64,
    ) -> Result<Standing, Unavailable> {
        match self {
            LimitStore::Embedded(store) => Ok(store.peek(key, limits, now_ms)),
            LimitStore::Redis(store) => store.peek(key, limits, now_ms).await,
        }
    }

    /// Writes what must survive a restart (the embedded store's snapshot); logs a failure.
    pub fn persist(&self) {
        if let LimitStore::Embedded(store) = self
            && let Err(e) = store.persist(crate::unix_ms())
        {
            log::error!("gateway: could not save the limiter state: {e}");
        }
    }
}
