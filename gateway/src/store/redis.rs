//! The Redis limit store: every key's windows, quota and ban in one Redis hash, decided by one
//! server-side script (`limits.lua`) in one round trip, so any number of gateways admit exactly
//! a key's limit between them.
//!
//! Time is the gateway's clock, passed to the script: the algorithm keeps time as a parameter
//! (so one table of cases drives both stores), and gateways' clocks are NTP-synchronised to
//! well under the second in which a window's start is expressed. Redis's own `TIME` would only
//! move the skew from between gateways to between the gateway and Redis.
//!
//! When Redis is unreachable or slower than `gateway.redis.timeout_ms`, the store says so once
//! in the log, counts every request it decides alone in `/metrics`, and applies
//! `gateway.redis.fallback`: `local` limits in this process with its share of each limit (the
//! limit divided by the gateways it last saw alive), `allow` admits, `deny` refuses with 503.
//! A heartbeat every half second (`heartbeat.rs`) announces this gateway (a sorted set of
//! instances with their last beat), counts the live ones, and notices Redis's return; the store
//! then goes back to it.
//!
//! The fallback does not start every key afresh. Each answer from Redis says where the key
//! stands (both windows and any ban); the fallback starts a key from the last of them, with
//! this gateway's share of what remained: a key with 30 of its minute's 100 left gets 15 of a
//! share of 50 when two gateways are alive, a banned key stays banned, a spent minute or day
//! stays spent. So an outage never hands a key more than it had left (at most its share of it
//! at each gateway), however long it lasts. A key Redis never answered for starts with its
//! share.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use redis::{ErrorKind, ServerErrorKind};
use serde::Deserialize;

use super::Unavailable;
use super::redis_reply::{Heard, ScriptReply, decision_from_reply};
use crate::bans::BanPolicy;
use crate::keys::KeyId;
use crate::limits::{DAY_MS, Decision, KeyState, Limiter, MINUTE_MS, Quota, Standing, Verdict};
use crate::metrics;
use crate::plans::Limits;
use crate::redis_conn::{RedisConn, RedisError, RedisHub, within};
use heartbeat::{gateways_alive, heartbeat_loop};

/// The script, loaded once per Redis and then called by its hash (`EVALSHA`).
const SCRIPT: &str = include_str!("limits.lua");
/// Default of `gateway.redis.timeout_ms`: a loopback or same-zone round trip is well under a
/// millisecond, so 50 ms means Redis is in trouble, and is small next to an upstream's latency.
pub const DEFAULT_TIMEOUT_MS: u64 = 50;

/// What a gateway does while Redis cannot decide (`gateway.redis.fallback`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fallback {
    /// Limit in this process with this gateway's share of each limit.
    #[default]
    Local,
    /// Admit every request with a valid key.
    Allow,
    /// Refuse with 503 `unavailable`.
    Deny,
}

/// The Redis hash of a key's state. The braces make the id the hash tag, so everything of one
/// key lands in one cluster slot whatever is added later.
pub fn state_key(key: KeyId) -> String {
    String::from_utf8(state_key_bytes(key).to_vec()).expect("ASCII")
}

/// [`state_key`] on the stack, as each decision sends it.
fn state_key_bytes(key: KeyId) -> [u8; 25] {
    let mut name = *b"as:lim:{0000000000000000}";
    hex::encode_to_slice(key.0.to_be_bytes(), &mut name[8..24]).expect("16 hex digits fit");
    name
}

/// Limits shared through Redis, with a local fallback.
pub struct RedisStore {
    hub: Arc<RedisHub>,
    script: redis::Script,
    timeout: Duration,
    fallback: Fallback,
    /// Whether the last word from Redis was good; requests skip Redis while it is not.
    up: AtomicBool,
    /// Gateways seen alive at the last heartbeat (at least 1: this one).
    alive: AtomicU64,
    /// The key (its id) whose decision or peek last failed, 0: none since Redis was last up.
    /// Redis is up again only once that key's state answers too: in a cluster whose master of
    /// that key's slot has failed, the heartbeat's own key may live on a node that is fine.
    failed_key: AtomicU64,
    /// This gateway's counts while Redis is away; forgotten when it returns.
    local: Limiter,
    /// Where Redis last said each key stands: what a key starts from in `local`.
    heard: DashMap<KeyId, Heard, foldhash::fast::RandomState>,
    instance: String,
    /// Set as this gateway leaves the live set: later heartbeats do nothing.
    left: AtomicBool,
    /// Held by a heartbeat through its round trip, so that leaving waits for one in flight.
    beating: tokio::sync::Mutex<()>,
}

impl RedisStore {
    /// A store on `hub`; starts its heartbeat on the hub's runtime. Never waits for Redis
    /// beyond the hub's connect timeout: without it, the store starts in fallback.
    pub fn start(hub: Arc<RedisHub>, timeout: Duration, fallback: Fallback) -> Arc<RedisStore> {
        let mut instance = [0u8; 8];
        let _ = getrandom::fill(&mut instance);
        let store = Arc::new(RedisStore {
            hub: hub.clone(),
            script: redis::Script::new(SCRIPT),
            timeout,
            fallback,
            up: AtomicBool::new(false),
            alive: AtomicU64::new(1),
            failed_key: AtomicU64::new(0),
            local: Limiter::new(),
            heard: DashMap::default(),
            instance: hex::encode(instance),
            left: AtomicBool::new(false),
            beating: tokio::sync::Mutex::new(()),
        });
        metrics::LIMIT_STORE_UP.set(0);
        metrics::LIMIT_STORE_GATEWAYS.set(1);
        let beat = hub.block_on(store.heartbeat());
        if let Err(e) = beat {
            log::warn!(
                "gateway: redis at {} is unreachable ({e}); limiting with fallback `{}` until it answers",
                hub.describe(),
                fallback.name()
            );
        }
        let weak = Arc::downgrade(&store);
        hub.spawn(heartbeat_loop(weak));
        store
    }

    /// Checks and, if admitted, counts one request of `key` under `bans`, in Redis if it
    /// answers in time.
    pub async fn check(
        &self,
        key: KeyId,
        limits: Limits,
        bans: &BanPolicy,
        now_ms: u64,
    ) -> Result<Decision, Unavailable> {
        if self.up.load(Ordering::Relaxed)
            && let Some(conn) = self.hub.local_conn()
        {
            match within(self.timeout, self.eval(conn, key, limits, bans, now_ms)).await {
                Ok((decision, heard)) => {
                    self.heard.insert(key, heard);
                    return Ok(decision);
                }
                Err(e) => self.went_down(Some(key), &e),
            }
        }
        metrics::LIMIT_STORE_FALLBACKS.inc();
        match self.fallback {
            Fallback::Local => {
                let share = self.start_locally(key, limits, now_ms);
                Ok(self.local.check(key, share, bans, now_ms))
            }
            Fallback::Allow => Ok(unlimited(limits, now_ms)),
            Fallback::Deny => Err(Unavailable),
        }
    }

    /// Where `key` stands, counting nothing: the script's hash read back and judged by the same
    /// Rust code that judges the embedded store's state.
    pub async fn peek(
        &self,
        key: KeyId,
        limits: Limits,
        now_ms: u64,
    ) -> Result<Standing, Unavailable> {
        if self.up.load(Ordering::Relaxed)
            && let Some(mut conn) = self.hub.local_conn()
        {
            let read = within(self.timeout, async {
                let fields: Vec<Option<u64>> = redis::cmd("HMGET")
                    .arg(state_key(key))
                    .arg(&["ms", "mc", "rf", "d", "dc", "bu", "bl", "lv"])
                    .query_async(&mut conn)
                    .await?;
                Ok(fields)
            })
            .await;
            match read {
                Ok(f) => {
                    let mut f = f.into_iter();
                    let state = KeyState::from_fields(std::array::from_fn(|_| f.next().flatten()));
                    let standing = state.peek(limits, now_ms);
                    self.heard.insert(key, Heard::of(&standing, now_ms));
                    return Ok(standing);
                }
                Err(e) => self.went_down(Some(key), &e),
            }
        }
        match self.fallback {
            Fallback::Local => {
                let share = self.start_locally(key, limits, now_ms);
                Ok(self.local.peek(key, share, now_ms))
            }
            Fallback::Allow => Ok(KeyState::default().peek(limits, now_ms)),
            Fallback::Deny => Err(Unavailable),
        }
    }

    /// One atomic decision in Redis: the script called by its hash, and loaded first into a
    /// Redis that does not have it (a new server, or one restarted or flushed since).
    ///
    /// The command is built in one buffer: redis-rs's `ScriptInvocation` would first collect
    /// every argument in a vector of its own, nine allocations a decision.
    async fn eval(
        &self,
        mut conn: RedisConn,
        key: KeyId,
        limits: Limits,
        bans: &BanPolicy,
        now_ms: u64,
    ) -> Result<(Decision, Heard), RedisError> {
        // State must outlive the longest ban and the window in which bans double.
        let ttl_ms = (bans.max + bans.repeat_window).as_millis() as u64 + 2 * DAY_MS;
        // Twelve arguments of about 150 bytes together (the hash alone is 40, the key's name 25).
        let mut call = redis::Cmd::with_capacity(12, 192);
        call.arg("EVALSHA")
            .arg(self.script.get_hash())
            .arg(1)
            .arg(&state_key_bytes(key)[..])
            .arg(now_ms)
            .arg(limits.per_minute)
            .arg(limits.per_day)
            .arg(bans.threshold)
            .arg(bans.base.as_millis() as u64)
            .arg(bans.max.as_millis() as u64)
            .arg(bans.repeat_window.as_millis() as u64)
            .arg(ttl_ms);
        let reply: ScriptReply = match call.query_async(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(&mut conn).await?;
                call.query_async(&mut conn).await?
            }
            reply => reply?,
        };
        decision_from_reply(reply.0, limits, now_ms)
    }

    /// This gateway's share of `limits` while it decides alone (the limit divided by the
    /// gateways it last saw alive); before `key`'s first decision alone, its local state starts
    /// from where Redis last said it stands, with the same share of what remained.
    fn start_locally(&self, key: KeyId, limits: Limits, now_ms: u64) -> Limits {
        let alive = self.alive.load(Ordering::Relaxed).max(1);
        let share = Limits {
            per_minute: (limits.per_minute / alive).max(1),
            per_day: (limits.per_day / alive).max(1),
        };
        if let Some(heard) = self.heard.get(&key).map(|h| *h) {
            self.local.start(key, || heard.state(share, alive, now_ms));
        }
        share
    }

    /// Forgets what Redis said of keys that no longer matters at `now_ms`.
    fn forget_what_has_ended(&self, now_ms: u64) {
        self.heard.retain(|_, h| !h.has_ended(now_ms));
    }

    /// Whether decisions are being made in Redis now (not by the fallback).
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Redis failed a command for `key`, or a heartbeat: requests use the fallback until a
    /// heartbeat succeeds (reading `key`'s state too), and then new connections.
    fn went_down(&self, key: Option<KeyId>, e: &RedisError) {
        if let Some(key) = key {
            self.failed_key.store(key.0, Ordering::Relaxed);
        }
        self.hub.forget_local_conns();
        if self.up.swap(false, Ordering::AcqRel) {
            self.local.clear();
            metrics::LIMIT_STORE_UP.set(0);
            metrics::LIMIT_STORE_OUTAGES.inc();
            let alive = self.alive.load(Ordering::Relaxed);
            let meanwhile = match self.fallback {
                Fallback::Local => format!(
                    "limiting alone with 1/{alive} of each limit ({})",
                    gateways_alive(alive)
                ),
                Fallback::Allow => "admitting every valid key".to_owned(),
                Fallback::Deny => "answering 503 unavailable".to_owned(),
            };
            log::warn!(
                "gateway: redis at {} failed ({e}); fallback `{}`: {meanwhile} until it answers",
                self.hub.describe(),
                self.fallback.name(),
            );
        }
    }
}

impl Fallback {
    /// The configuration's word for it.
    pub fn name(self) -> &'static str {
        match self {
            Fallback::Local => "local",
            Fallback::Allow => "allow",
            Fallback::Deny => "deny",
        }
    }
}

/// What `fallback = "allow"` answers: admitted, with the plan's limit and nothing known spent.
fn unlimited(limits: Limits, now_ms: u64) -> Decision {
    Decision {
        verdict: Verdict::Admitted,
        quota: Quota {
            name: "minute",
            limit: limits.per_minute,
            remaining: limits.per_minute,
            reset_ms: now_ms + MINUTE_MS,
        },
        ban_imposed: false,
    }
}

mod heartbeat;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_hash_in_redis_is_named_as_it_always_was() {
        // Gateways of different versions share one Redis: the name must not move.
        for id in [0, 1, 0x9d47_14c8_eb0f_c065, u64::MAX] {
            let key = KeyId(id);
            assert_eq!(state_key(key), format!("as:lim:{{{key}}}"));
        }
        assert_eq!(state_key(KeyId(0xab)), "as:lim:{00000000000000ab}");
    }
}
