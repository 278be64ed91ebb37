//! Exact per-key limits: a minute window and a UTC-day quota, checked and counted in one step
//! per key, so no interleaving of concurrent requests admits more than the limit.
//!
//! The minute window starts at the key's first request after the previous window ended; the
//! day window is the UTC calendar day. Refused requests do not count against either, but they
//! count towards a ban (see [`crate::bans`]). `now` is a parameter: tests walk window edges and
//! day boundaries without sleeping.
//!
//! [`KeyState::check`] is the algorithm. Where the state lives is [`crate::store`]'s business:
//! in this process ([`Limiter`], persisted by the embedded store) or in Redis, whose script
//! (`store/limits.lua`) is the only other copy of this algorithm.

use std::num::NonZeroU64;

use crate::bans::{BanPolicy, BanState};
use crate::plans::Limits;

mod limiter;

pub use limiter::Limiter;

/// Length of the minute window, in milliseconds.
pub const MINUTE_MS: u64 = 60_000;
/// Length of a UTC day, in milliseconds.
pub const DAY_MS: u64 = 86_400_000;

/// What happened to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Counted and let through.
    Admitted,
    /// The minute window is spent.
    RateLimited,
    /// The day quota is spent.
    QuotaExceeded,
    /// The key is banned.
    Banned,
}

/// The window a response describes: the one with the fewest requests remaining (the minute
/// window on ties), or the ban.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// `"minute"` or `"day"`: the policy name in the draft `RateLimit` header.
    pub name: &'static str,
    /// That window's limit.
    pub limit: u64,
    /// Requests left in it (0 while banned).
    pub remaining: u64,
    /// Unix milliseconds at which it resets (or the ban ends).
    pub reset_ms: u64,
}

/// The limiter's answer for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Admitted or why not.
    pub verdict: Verdict,
    /// What the rate-limit headers describe.
    pub quota: Quota,
    /// This request's refusal imposed the ban (for metrics; later requests are merely banned).
    pub ban_imposed: bool,
}

impl Decision {
    /// Whole seconds until a retry can be admitted (at least 1); only for refusals.
    pub fn retry_after_secs(&self, now_ms: u64) -> Option<u64> {
        (self.verdict != Verdict::Admitted)
            .then(|| ceil_secs(self.quota.reset_ms.saturating_sub(now_ms)).max(1))
    }
}

/// Milliseconds rounded up to whole seconds.
pub fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// One key's limiter state: all that a store keeps per key, in 48 bytes (a million active keys
/// take about 88 MB in the limiter's table, a 64-byte slot each, [`crate::state_table`]). Counts
/// within a minute are 32-bit and saturate: no process admits 2^32 requests a minute, so a
/// larger limit behaves the same. The ban's fields are kept side by side with the others rather
/// than as a nested [`BanState`], whose padding would leave no room in the 48 bytes for
/// `changed`.
///
/// The fields are laid out in this order (`repr(C)`): what every decision reads or writes comes
/// first, in 33 bytes. With its key, a state fills one slot of the limiter's table, a cache
/// line, so a decision among a million keys reads one line from memory.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KeyState {
    /// Unix milliseconds at which the current (or last) ban ends.
    pub ban_until_ms: u64,
    /// Unix milliseconds at which the current minute window opened, if one did.
    pub minute_start_ms: Option<NonZeroU64>,
    /// Requests admitted on `day`.
    pub day_count: u64,
    /// Requests admitted in the minute window.
    pub minute_count: u32,
    /// The UTC day (days since the epoch) that `day_count` counts.
    pub day: u32,
    /// Changed since [`Limiter::changes`] last took it: the limiter's mark, never stored.
    pub(crate) changed: bool,
    /// Doublings of the last ban.
    pub ban_level: u8,
    /// Requests refused in the minute window, towards a ban (saturating).
    pub refused_in_window: u32,
    /// When the last ban started, if there was one.
    pub ban_last_start_ms: Option<NonZeroU64>,
}

/// The UTC day of `now_ms`, in days since the epoch.
pub fn day_of(now_ms: u64) -> u32 {
    u32::try_from(now_ms / DAY_MS).unwrap_or(u32::MAX)
}

impl KeyState {
    /// A state from its fields as the stores keep them (Redis's hash, the embedded snapshot):
    /// 64-bit numbers for the minute window's start, minute count, refusals, day, day count,
    /// ban end, last ban start and ban level, in that order. Absent ones are none or 0; values
    /// too large for their field saturate.
    pub fn from_fields(f: [Option<u64>; 8]) -> KeyState {
        let narrow = |v: Option<u64>| u32::try_from(v.unwrap_or(0)).unwrap_or(u32::MAX);
        KeyState {
            minute_start_ms: f[0].and_then(NonZeroU64::new),
            minute_count: narrow(f[1]),
            refused_in_window: narrow(f[2]),
            day: narrow(f[3]),
            day_count: f[4].unwrap_or(0),
            ban_until_ms: f[5].unwrap_or(0),
            ban_last_start_ms: f[6].and_then(NonZeroU64::new),
            ban_level: u8::try_from(f[7].unwrap_or(0)).unwrap_or(u8::MAX),
            changed: false,
        }
    }

    /// The fields [`KeyState::from_fields`] reads.
    pub fn fields(&self) -> [Option<u64>; 8] {
        [
            self.minute_start_ms.map(NonZeroU64::get),
            Some(self.minute_count.into()),
            Some(self.refused_in_window.into()),
            Some(self.day.into()),
            Some(self.day_count),
            Some(self.ban_until_ms),
            self.ban_last_start_ms.map(NonZeroU64::get),
            Some(self.ban_level.into()),
        ]
    }

    /// The ban's part of the state, for [`BanState`]'s rules.
    pub fn ban(&self) -> BanState {
        BanState {
            until_ms: self.ban_until_ms,
            last_start_ms: self.ban_last_start_ms,
            level: self.ban_level,
        }
    }

    fn set_ban(&mut self, ban: BanState) {
        self.ban_until_ms = ban.until_ms;
        self.ban_last_start_ms = ban.last_start_ms;
        self.ban_level = ban.level;
    }

    /// Checks and, if admitted, counts one request at `now_ms` (Unix milliseconds).
    pub fn check(&mut self, limits: Limits, bans: &BanPolicy, now_ms: u64) -> Decision {
        if let Some(until) = self.ban().active_until(now_ms) {
            return banned(limits, until);
        }
        if self
            .minute_start_ms
            .is_none_or(|start| now_ms >= start.get() + MINUTE_MS)
        {
            self.minute_start_ms = NonZeroU64::new(now_ms);
            self.minute_count = 0;
            self.refused_in_window = 0;
        }
        let today = day_of(now_ms);
        if self.day != today {
            self.day = today;
            self.day_count = 0;
        }
        let minute_left = limits
            .per_minute
            .saturating_sub(u64::from(self.minute_count));
        let day_left = limits.per_day.saturating_sub(self.day_count);
        let verdict = if minute_left > 0 && day_left > 0 {
            self.minute_count = self.minute_count.saturating_add(1);
            self.day_count += 1;
            Verdict::Admitted
        } else {
            self.refused_in_window = self.refused_in_window.saturating_add(1);
            if self.refused_in_window > bans.threshold {
                self.refused_in_window = 0;
                let mut ban = self.ban();
                let until = ban.impose(bans, now_ms);
                self.set_ban(ban);
                return Decision {
                    ban_imposed: true,
                    ..banned(limits, until)
                };
            }
            // When both are spent, the day is the longer wait.
            if day_left == 0 {
                Verdict::QuotaExceeded
            } else {
                Verdict::RateLimited
            }
        };
        let minute = Quota {
            name: "minute",
            limit: limits.per_minute,
            remaining: limits
                .per_minute
                .saturating_sub(u64::from(self.minute_count)),
            reset_ms: self.minute_start_ms.map_or(now_ms, NonZeroU64::get) + MINUTE_MS,
        };
        let day = Quota {
            name: "day",
            limit: limits.per_day,
            remaining: limits.per_day.saturating_sub(self.day_count),
            reset_ms: (u64::from(today) + 1) * DAY_MS,
        };
        Decision {
            verdict,
            quota: headline(verdict, minute, day),
            ban_imposed: false,
        }
    }

    /// Where the key stands at `now_ms`, counting nothing: what `GET /v1/rate_limit` shows.
    pub fn peek(&self, limits: Limits, now_ms: u64) -> Standing {
        let minute_open = self
            .minute_start_ms
            .map(NonZeroU64::get)
            .filter(|start| now_ms < start + MINUTE_MS);
        let today = day_of(now_ms);
        let minute_used = if minute_open.is_some() {
            u64::from(self.minute_count)
        } else {
            0
        };
        let day_used = if self.day == today { self.day_count } else { 0 };
        Standing {
            minute: Quota {
                name: "minute",
                limit: limits.per_minute,
                remaining: limits.per_minute.saturating_sub(minute_used),
                // No window open: the next request opens one that ends a minute later.
                reset_ms: minute_open.unwrap_or(now_ms) + MINUTE_MS,
            },
            day: Quota {
                name: "day",
                limit: limits.per_day,
                remaining: limits.per_day.saturating_sub(day_used),
                reset_ms: (u64::from(today) + 1) * DAY_MS,
            },
            banned_until_ms: self.ban().active_until(now_ms),
        }
    }

    /// Whether nothing of this state matters any more at `now_ms`: its windows are over and its
    /// ban history can no longer lengthen a ban. Such state is dropped from snapshots.
    pub fn is_idle(&self, bans: &BanPolicy, now_ms: u64) -> bool {
        let minute_over = self
            .minute_start_ms
            .is_none_or(|start| now_ms >= start.get() + MINUTE_MS);
        minute_over && self.day != day_of(now_ms) && self.ban().is_forgotten(bans, now_ms)
    }
}

/// Where a key stands, without counting a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// The minute window.
    pub minute: Quota,
    /// The UTC day.
    pub day: Quota,
    /// Unix milliseconds at which the key's ban ends, while it is banned.
    pub banned_until_ms: Option<u64>,
}

impl Standing {
    /// What the rate-limit headers describe: the ban while banned, else the window with the
    /// fewest requests remaining (the minute window on ties), as for a counted request.
    pub fn headline(&self, limits: Limits) -> Quota {
        match self.banned_until_ms {
            Some(until) => banned(limits, until).quota,
            None => headline(Verdict::Admitted, self.minute, self.day),
        }
    }
}

/// The window a decision that is not a ban describes: the one that refused it, else the one
/// with the fewest requests remaining (the minute window on ties).
pub fn headline(verdict: Verdict, minute: Quota, day: Quota) -> Quota {
    match verdict {
        Verdict::QuotaExceeded => day,
        Verdict::RateLimited => minute,
        _ if day.remaining < minute.remaining => day,
        _ => minute,
    }
}

/// The decision for a banned key: nothing remains until the ban ends.
pub fn banned(limits: Limits, until_ms: u64) -> Decision {
    Decision {
        verdict: Verdict::Banned,
        quota: Quota {
            name: "minute",
            limit: limits.per_minute,
            remaining: 0,
            reset_ms: until_ms,
        },
        ban_imposed: false,
    }
}

#[cfg(test)]
mod tests;
