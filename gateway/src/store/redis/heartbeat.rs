//! The fleet's liveness through Redis: every half second each gateway announces itself in a
//! sorted set of instances scored by their last beat, counts the live ones (the share of each
//! limit a gateway takes while Redis is away is the limit divided by them), and notices Redis's
//! return. A gateway that stops leaves the set, so the others' shares grow at once.

use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{RedisStore, state_key};
use crate::keys::KeyId;
use crate::metrics;
use crate::redis_conn::{CONNECT_TIMEOUT, RedisError, within};

/// Gateways announce themselves here: members are instance ids, scores their last beat.
const GATEWAYS_KEY: &str = "as:gateways";
/// How often a gateway beats (and, while Redis is away, tries it again).
const HEARTBEAT: Duration = Duration::from_millis(500);
/// A gateway silent for this long no longer counts as alive.
const ALIVE_MS: u64 = 5_000;
/// How often what Redis said of keys is swept of what no longer matters (every key used today
/// matters until the day ends, so a sweep walks many: not every heartbeat).
const SWEEP_HEARD: Duration = Duration::from_secs(60);

impl RedisStore {
    /// Announces this gateway, counts the live ones, and marks Redis up when it answers.
    pub(super) async fn heartbeat(&self) -> Result<(), RedisError> {
        let _beating = self.beating.lock().await;
        if self.left.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut conn = within(CONNECT_TIMEOUT, self.hub.connect()).await?;
        let now = crate::unix_ms();
        let (_, _, alive): (i64, i64, u64) =
            within(self.timeout.max(Duration::from_millis(500)), async {
                Ok(redis::pipe()
                    .zadd(GATEWAYS_KEY, &self.instance, now)
                    .zrembyscore(GATEWAYS_KEY, "-inf", now.saturating_sub(ALIVE_MS))
                    .zcard(GATEWAYS_KEY)
                    .query_async(&mut conn)
                    .await?)
            })
            .await?;
        self.alive.store(alive.max(1), Ordering::Relaxed);
        metrics::LIMIT_STORE_GATEWAYS.set(i64::try_from(alive.max(1)).unwrap_or(i64::MAX));
        let failed = self.failed_key.load(Ordering::Relaxed);
        if failed != 0 {
            within(self.timeout.max(Duration::from_millis(500)), async {
                let _: i64 = redis::cmd("EXISTS")
                    .arg(state_key(KeyId(failed)))
                    .query_async(&mut conn)
                    .await?;
                Ok(())
            })
            .await?;
            let _ =
                self.failed_key
                    .compare_exchange(failed, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
        if !self.up.swap(true, Ordering::AcqRel) {
            metrics::LIMIT_STORE_UP.set(1);
            log::info!(
                "gateway: limits are shared through redis at {} ({})",
                self.hub.describe(),
                gateways_alive(alive)
            );
        }
        Ok(())
    }

    /// Removes this gateway from the live set, so the others' shares grow at once. A heartbeat
    /// in flight would put it back if its `ZADD` landed after the `ZREM`: leaving waits for it
    /// (each of its commands has a timeout, so a Redis that stopped answering does not hold up
    /// shutdown for long), and stops those to come.
    pub fn leave(&self) {
        self.left.store(true, Ordering::Release);
        let Some(mut conn) = self.hub.conn() else {
            return; // Redis never answered: this gateway is not in the set
        };
        self.hub.block_on(async {
            let _beating = self.beating.lock().await;
            let result: Result<(), RedisError> = within(self.timeout, async {
                let _: i64 = redis::cmd("ZREM")
                    .arg(GATEWAYS_KEY)
                    .arg(&self.instance)
                    .query_async(&mut conn)
                    .await?;
                Ok(())
            })
            .await;
            if let Err(e) = result {
                log::debug!("gateway: could not leave the live set: {e}");
            }
        });
    }
}

/// Beats every [`HEARTBEAT`] while the store lives, and now and then forgets what Redis said of
/// keys whose windows have all ended.
pub(super) async fn heartbeat_loop(store: Weak<RedisStore>) {
    let mut tick = tokio::time::interval(HEARTBEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_sweep = std::time::Instant::now();
    loop {
        tick.tick().await;
        let Some(store) = store.upgrade() else { return };
        if let Err(e) = store.heartbeat().await {
            store.went_down(None, &e);
        }
        if last_sweep.elapsed() >= SWEEP_HEARD {
            last_sweep = std::time::Instant::now();
            store.forget_what_has_ended(crate::unix_ms());
        }
    }
}

/// "1 gateway alive", "3 gateways alive".
pub(super) fn gateways_alive(n: u64) -> String {
    match n {
        1 => "1 gateway alive".to_owned(),
        n => format!("{n} gateways alive"),
    }
}
