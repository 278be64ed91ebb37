//! What the Redis store hears from Redis: the limits script's reply, read as the decision, and
//! where it leaves the key (`Heard`), which the store keeps so that its fallback can start a
//! key from there when Redis goes away (see [`super::redis`]).

use std::num::NonZeroU64;

use crate::limits::{
    DAY_MS, Decision, KeyState, MINUTE_MS, Quota, Standing, Verdict, banned, day_of, headline,
};
use crate::plans::Limits;
use crate::redis_conn::RedisError;

/// Where Redis last said a key stands (Unix milliseconds), in 32 bytes: one is kept for every
/// key used today.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Heard {
    /// When the minute window ends.
    minute_reset_ms: u64,
    /// The day's requests left.
    day_remaining: u64,
    /// When the ban ends (in the past: no ban).
    ban_until_ms: u64,
    /// The minute window's requests left (counts within a minute are 32-bit, see `KeyState`).
    minute_remaining: u32,
    /// The UTC day of `day_remaining`.
    day: u32,
}

impl Heard {
    /// What `standing`, read at `now_ms`, says.
    pub(super) fn of(standing: &Standing, now_ms: u64) -> Heard {
        Heard {
            minute_reset_ms: standing.minute.reset_ms,
            day_remaining: standing.day.remaining,
            ban_until_ms: standing.banned_until_ms.unwrap_or(0),
            minute_remaining: u32::try_from(standing.minute.remaining).unwrap_or(u32::MAX),
            day: day_of(now_ms),
        }
    }

    /// A local state at `now_ms` for one of `alive` gateways, whose share of the limits is
    /// `share`: what remains of each window still open is divided between the gateways (rounded
    /// down, so together they never admit more than remained), and a ban stays. The ban's
    /// history is not known here: a ban imposed alone starts again from the shortest.
    pub(super) fn state(self, share: Limits, alive: u64, now_ms: u64) -> KeyState {
        let mut state = KeyState {
            ban_until_ms: self.ban_until_ms,
            ..KeyState::default()
        };
        if now_ms < self.minute_reset_ms {
            let left = u64::from(self.minute_remaining) / alive;
            state.minute_start_ms = NonZeroU64::new(self.minute_reset_ms.saturating_sub(MINUTE_MS));
            state.minute_count =
                u32::try_from(share.per_minute.saturating_sub(left)).unwrap_or(u32::MAX);
        }
        if day_of(now_ms) == self.day {
            state.day = self.day;
            state.day_count = share.per_day.saturating_sub(self.day_remaining / alive);
        }
        state
    }

    /// Whether nothing of it matters at `now_ms`: its minute, its day and its ban are over.
    pub(super) fn has_ended(&self, now_ms: u64) -> bool {
        now_ms >= self.minute_reset_ms && now_ms >= self.ban_until_ms && day_of(now_ms) != self.day
    }
}

/// The script's reply, `[verdict, minute_remaining, minute_reset_ms, day_remaining,
/// ban_until_ms]`, as the decision and where the key stands after it.
pub(super) fn decision_from_reply(
    reply: [u64; 5],
    limits: Limits,
    now_ms: u64,
) -> Result<(Decision, Heard), RedisError> {
    let [
        code,
        minute_remaining,
        minute_reset_ms,
        day_remaining,
        ban_until_ms,
    ] = reply;
    let verdict = match code {
        0 => Verdict::Admitted,
        1 => Verdict::RateLimited,
        2 => Verdict::QuotaExceeded,
        3 | 4 => Verdict::Banned,
        other => {
            return Err(RedisError::Command(format!(
                "script answered verdict {other}"
            )));
        }
    };
    let minute = Quota {
        name: "minute",
        limit: limits.per_minute,
        remaining: minute_remaining,
        reset_ms: minute_reset_ms,
    };
    let day = Quota {
        name: "day",
        limit: limits.per_day,
        remaining: day_remaining,
        reset_ms: (u64::from(day_of(now_ms)) + 1) * DAY_MS,
    };
    let decision = match verdict {
        Verdict::Banned => Decision {
            ban_imposed: code == 4,
            ..banned(limits, ban_until_ms)
        },
        verdict => Decision {
            verdict,
            quota: headline(verdict, minute, day),
            ban_imposed: false,
        },
    };
    let heard = Heard {
        minute_reset_ms,
        day_remaining,
        ban_until_ms,
        minute_remaining: u32::try_from(minute_remaining).unwrap_or(u32::MAX),
        day: day_of(now_ms),
    };
    Ok((decision, heard))
}

/// The script's reply: verdict, minute remaining, minute reset, day remaining and ban end, as
/// five decimal integers separated by spaces in one string (`limits.lua`). redis-rs parses one
/// string in about 4,000 fewer instructions than an array of five integers, 4% of a GET's.
/// Gateways of versions whose scripts answer differently still share one Redis: each calls its
/// own script by its hash, and the fields of a key's state are the same.
pub(super) struct ScriptReply(pub(super) [u64; 5]);

impl redis::FromRedisValue for ScriptReply {
    fn from_redis_value(value: redis::Value) -> Result<ScriptReply, redis::ParsingError> {
        if let redis::Value::BulkString(bytes) = &value
            && let Some(numbers) = parse_reply(bytes)
        {
            return Ok(ScriptReply(numbers));
        }
        Err(format!("the limits script answered {value:?}").into())
    }
}

/// Five decimal integers, each of at most 19 digits, separated by single spaces.
fn parse_reply(bytes: &[u8]) -> Option<[u64; 5]> {
    let mut fields = bytes.split(|&b| b == b' ');
    let mut numbers = [0; 5];
    for number in &mut numbers {
        let digits = fields.next()?;
        if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        *number = digits.iter().fold(0, |n, &d| n * 10 + u64::from(d - b'0'));
    }
    fields.next().is_none().then_some(numbers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bans::BanPolicy;
    use crate::keys::KeyId;
    use crate::limits::Limiter;

    /// 2026-11-22T10:00:00Z, well inside a UTC day.
    const T0: u64 = 1_795_341_600_000;

    /// What Redis said at `T0`: a minute ending 20 s later with `minute_remaining` left, the day
    /// with `day_remaining`, a ban until `ban_until_ms`.
    fn heard(minute_remaining: u32, day_remaining: u64, ban_until_ms: u64) -> Heard {
        Heard {
            minute_reset_ms: T0 + 20_000,
            day_remaining,
            ban_until_ms,
            minute_remaining,
            day: day_of(T0),
        }
    }

    fn count_admitted(state: KeyState, share: Limits, now_ms: u64) -> usize {
        let local = Limiter::new();
        local.start(KeyId(1), || state);
        (0..1000)
            .take_while(|_| {
                local
                    .check(KeyId(1), share, &BanPolicy::default(), now_ms)
                    .verdict
                    == Verdict::Admitted
            })
            .count()
    }

    /// One is kept for every key used today.
    #[test]
    fn what_redis_said_of_a_key_is_32_bytes() {
        assert_eq!(std::mem::size_of::<Heard>(), 32);
    }

    #[test]
    fn each_gateway_starts_alone_with_its_share_of_what_remained() {
        let heard = heard(31, 1_000, 0);
        let limits = Limits {
            per_minute: 100,
            per_day: 10_000,
        };
        // Alone: what remained. One of two: half of it, rounded down.
        let state = heard.state(limits, 1, T0);
        assert_eq!(count_admitted(state, limits, T0), 31);
        assert_eq!(
            state.minute_start_ms.unwrap().get(),
            T0 + 20_000 - MINUTE_MS
        );
        let share = Limits {
            per_minute: 50,
            per_day: 5_000,
        };
        assert_eq!(count_admitted(heard.state(share, 2, T0), share, T0), 15);
        // Once the minute Redis knew of has ended, a new one opens with the share; the day
        // still counts what remained of it.
        let later = T0 + 20_000;
        assert_eq!(
            count_admitted(heard.state(share, 2, later), share, later),
            50
        );
        let tight = Heard {
            day_remaining: 7,
            ..heard
        };
        assert_eq!(
            count_admitted(tight.state(share, 2, later), share, later),
            3
        );
        // The next day is a new day.
        let tomorrow = (u64::from(day_of(T0)) + 1) * DAY_MS;
        assert_eq!(
            count_admitted(tight.state(share, 2, tomorrow), share, tomorrow),
            50
        );
    }

    #[test]
    fn a_ban_redis_imposed_holds_alone_until_it_ends() {
        let heard = heard(60, 1_000, T0 + 900_000);
        let limits = Limits {
            per_minute: 60,
            per_day: 1_000,
        };
        let state = heard.state(limits, 1, T0);
        assert_eq!(count_admitted(state, limits, T0), 0);
        assert_eq!(count_admitted(state, limits, T0 + 900_000), 60);
        assert!(!heard.has_ended(T0 + 899_999));
        let tomorrow = (u64::from(day_of(T0)) + 1) * DAY_MS;
        assert!(heard.has_ended(tomorrow));
    }

    #[test]
    fn the_scripts_reply_reads_as_the_embedded_store_would_decide() {
        let limits = Limits {
            per_minute: 60,
            per_day: 1_000,
        };
        // Admitted with fewer left of the day than of the minute: the headers describe the day.
        let (d, heard) = decision_from_reply([0, 50, T0 + 60_000, 10, 0], limits, T0).unwrap();
        assert_eq!(d.verdict, Verdict::Admitted);
        assert_eq!((d.quota.name, d.quota.remaining), ("day", 10));
        assert_eq!(d.quota.reset_ms, (u64::from(day_of(T0)) + 1) * DAY_MS);
        assert_eq!((heard.minute_remaining, heard.day_remaining), (50, 10));
        // Banned by this request.
        let (d, heard) =
            decision_from_reply([4, 0, T0 + 60_000, 10, T0 + 900_000], limits, T0).unwrap();
        assert_eq!((d.verdict, d.ban_imposed), (Verdict::Banned, true));
        assert_eq!((d.quota.remaining, d.quota.reset_ms), (0, T0 + 900_000));
        assert_eq!(heard.ban_until_ms, T0 + 900_000);
        assert!(decision_from_reply([5, 0, 0, 0, 0], limits, T0).is_err());
    }

    #[test]
    fn the_scripts_reply_is_five_integers_or_an_error() {
        assert_eq!(
            parse_reply(b"1 0 1795341660000 9007199254740991 0"),
            Some([1, 0, 1_795_341_660_000, (1 << 53) - 1, 0])
        );
        assert_eq!(
            parse_reply(b"0 9999999999999999999 0 0 0"),
            Some([0, 9_999_999_999_999_999_999, 0, 0, 0])
        );
        for bad in [
            &b""[..],
            b"0 1 2 3",
            b"0 1 2 3 4 5",
            b"0 1 2 3 4 ",
            b"0  1 2 3 4",
            b"0 1 2 3 -4",
            b"0 1 2 3 1e+14",
            b"0 1 2 3 4.5",
            b"0 1 2 3 10000000000000000000",
        ] {
            assert_eq!(parse_reply(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        let reply = redis::Value::BulkString(b"3 0 1 2 3".to_vec());
        assert_eq!(
            <ScriptReply as redis::FromRedisValue>::from_redis_value(reply)
                .unwrap()
                .0,
            [3, 0, 1, 2, 3]
        );
        let array = redis::Value::Array(vec![redis::Value::Int(0); 5]);
        assert!(<ScriptReply as redis::FromRedisValue>::from_redis_value(array).is_err());
    }
}
