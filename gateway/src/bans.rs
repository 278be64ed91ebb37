//! Temporary key bans: a key that keeps hammering after 429s is shut out for a while.
//!
//! More than `threshold` refusals within one minute window ban the key for `base`; each further
//! ban that starts within `repeat_window` of the previous one doubles the time, up to `max`.
//! Pure state and arithmetic: the limiter calls it under its per-key lock, with `now`.

use std::num::NonZeroU64;
use std::time::Duration;

/// The ban rules, from `[gateway.bans]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BanPolicy {
    /// Refusals within one window that are tolerated; one more bans the key.
    pub threshold: u32,
    /// Length of a first ban.
    pub base: Duration,
    /// Longest ban.
    pub max: Duration,
    /// A ban starting within this time of the previous one lasts twice as long.
    pub repeat_window: Duration,
}

impl Default for BanPolicy {
    fn default() -> Self {
        BanPolicy {
            threshold: 10,
            base: Duration::from_secs(15 * 60),
            max: Duration::from_secs(24 * 3600),
            repeat_window: Duration::from_secs(24 * 3600),
        }
    }
}

/// One key's way to a ban: refusals towards the next one, and the history of the last.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BanState {
    /// Unix milliseconds at which the current (or last) ban ends.
    pub until_ms: u64,
    /// When the last ban started, if there was one.
    pub last_start_ms: Option<NonZeroU64>,
    /// Doublings of the last ban (0 for a first ban; a ban stops growing at `max` long before
    /// 255 doublings).
    pub level: u8,
}

impl BanState {
    /// When the current ban ends, if the key is banned at `now_ms`.
    pub fn active_until(&self, now_ms: u64) -> Option<u64> {
        (now_ms < self.until_ms).then_some(self.until_ms)
    }

    /// Whether this history can no longer affect a ban at `now_ms`: no ban is active and a new
    /// one would not be a repeat.
    pub fn is_forgotten(&self, policy: &BanPolicy, now_ms: u64) -> bool {
        now_ms >= self.until_ms
            && self.last_start_ms.is_none_or(|last| {
                now_ms.saturating_sub(last.get()) >= policy.repeat_window.as_millis() as u64
            })
    }

    /// Bans the key from `now_ms`; returns when the ban ends.
    pub fn impose(&mut self, policy: &BanPolicy, now_ms: u64) -> u64 {
        let repeat = self.last_start_ms.is_some_and(|last| {
            now_ms.saturating_sub(last.get()) < policy.repeat_window.as_millis() as u64
        });
        self.level = if repeat {
            self.level.saturating_add(1)
        } else {
            0
        };
        let factor = 1u64
            .checked_shl(u32::from(self.level.min(40)))
            .unwrap_or(u64::MAX);
        let length = (policy.base.as_millis() as u64)
            .saturating_mul(factor)
            .min(policy.max.as_millis() as u64);
        self.last_start_ms = NonZeroU64::new(now_ms);
        self.until_ms = now_ms + length;
        self.until_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000;

    #[test]
    fn bans_double_within_a_day_and_cap() {
        let policy = BanPolicy::default();
        let mut ban = BanState::default();
        let t0 = 1_000_000;
        assert_eq!(ban.impose(&policy, t0), t0 + 15 * MIN);
        assert_eq!(ban.active_until(t0 + 15 * MIN - 1), Some(t0 + 15 * MIN));
        assert_eq!(ban.active_until(t0 + 15 * MIN), None);
        let t1 = t0 + 20 * MIN;
        assert_eq!(ban.impose(&policy, t1), t1 + 30 * MIN);
        let t2 = t1 + 40 * MIN;
        assert_eq!(ban.impose(&policy, t2), t2 + 60 * MIN);
        let mut t = t2;
        for _ in 0..10 {
            t += 25 * MIN; // each within 24 h of the previous ban
            ban.impose(&policy, t);
        }
        assert_eq!(
            ban.active_until(t),
            Some(t + 24 * 60 * MIN),
            "capped at 24 h"
        );
        // A day of good behaviour resets the doubling.
        let later = t + 24 * 60 * MIN + 1;
        assert_eq!(ban.impose(&policy, later), later + 15 * MIN);
    }
}
