//! Unit tests of [`super`] (`limits.rs` and `limits/limiter.rs`).

use super::limiter::CHANGES_CHUNK;
use super::*;
use crate::keys::KeyId;
use proptest::prelude::*;
use std::sync::Arc;

/// A state and its key fill one 64-byte slot of the limiter's table only while the state
/// stays this small.
#[test]
fn a_key_state_is_48_bytes() {
    assert_eq!(std::mem::size_of::<KeyState>(), 48);
    // What every decision touches comes first: through the change mark, 33 bytes.
    assert_eq!(std::mem::offset_of!(KeyState, changed), 32);
}

const FREE: Limits = Limits {
    per_minute: 60,
    per_day: 1000,
};
const K: KeyId = KeyId(7);
/// 2026-11-22T10:00:00Z, well inside a UTC day.
const T0: u64 = 1_795_341_600_000;

#[test]
fn counts_down_then_refuses_and_reopens_at_the_window_end() {
    let l = Limiter::default();
    for i in 0..60 {
        let d = l.check(K, FREE, &BanPolicy::default(), T0 + i * 10);
        assert_eq!(d.verdict, Verdict::Admitted);
        assert_eq!(d.quota.remaining, 59 - i);
        assert_eq!(
            d.quota.reset_ms,
            T0 + MINUTE_MS,
            "the window starts at the first request"
        );
    }
    let d = l.check(K, FREE, &BanPolicy::default(), T0 + 30_000);
    assert_eq!(d.verdict, Verdict::RateLimited);
    assert_eq!(d.quota.remaining, 0);
    assert_eq!(d.retry_after_secs(T0 + 30_000), Some(30));
    // A retry after Retry-After seconds is admitted.
    assert_eq!(
        l.check(K, FREE, &BanPolicy::default(), T0 + 30_000 + 30_000)
            .verdict,
        Verdict::Admitted
    );
}

#[test]
fn refusals_do_not_count_and_the_window_is_not_clock_aligned() {
    let l = Limiter::default();
    let start = T0 + 12_345;
    for _ in 0..60 {
        l.check(K, FREE, &BanPolicy::default(), start);
    }
    for _ in 0..5 {
        assert_eq!(
            l.check(K, FREE, &BanPolicy::default(), start + 1).verdict,
            Verdict::RateLimited
        );
    }
    assert_eq!(
        l.check(K, FREE, &BanPolicy::default(), start + MINUTE_MS - 1)
            .verdict,
        Verdict::RateLimited
    );
    let d = l.check(K, FREE, &BanPolicy::default(), start + MINUTE_MS);
    assert_eq!((d.verdict, d.quota.remaining), (Verdict::Admitted, 59));
    assert_eq!(d.quota.reset_ms, start + 2 * MINUTE_MS);
}

#[test]
fn day_quota_resets_at_utc_midnight() {
    let limits = Limits {
        per_minute: 1000,
        per_day: 3,
    };
    let l = Limiter::default();
    let midnight = (T0 / DAY_MS + 1) * DAY_MS;
    let late = midnight - 90_000;
    for remaining in [2, 1, 0] {
        let d = l.check(K, limits, &BanPolicy::default(), late);
        assert_eq!(
            (d.verdict, d.quota.name, d.quota.remaining),
            (Verdict::Admitted, "day", remaining)
        );
        assert_eq!(d.quota.reset_ms, midnight);
    }
    let d = l.check(K, limits, &BanPolicy::default(), late + 1000);
    assert_eq!(d.verdict, Verdict::QuotaExceeded);
    assert_eq!(
        d.retry_after_secs(late + 1000),
        Some(89),
        "Retry-After runs to UTC midnight"
    );
    assert_eq!(
        l.check(K, limits, &BanPolicy::default(), midnight - 1)
            .verdict,
        Verdict::QuotaExceeded
    );
    let d = l.check(K, limits, &BanPolicy::default(), midnight);
    assert_eq!((d.verdict, d.quota.remaining), (Verdict::Admitted, 2));
}

#[test]
fn headers_describe_the_window_with_fewest_remaining_minute_on_ties() {
    let l = Limiter::default();
    let limits = Limits {
        per_minute: 5,
        per_day: 5,
    };
    let d = l.check(K, limits, &BanPolicy::default(), T0);
    assert_eq!((d.quota.name, d.quota.remaining), ("minute", 4));
    let limits = Limits {
        per_minute: 10,
        per_day: 5,
    };
    let d = l.check(KeyId(8), limits, &BanPolicy::default(), T0);
    assert_eq!(
        (d.quota.name, d.quota.remaining, d.quota.limit),
        ("day", 4, 5)
    );
}

#[test]
fn eleven_refusals_in_one_window_ban_the_key_and_others_are_unaffected() {
    let l = Limiter::default();
    let limits = Limits {
        per_minute: 2,
        per_day: 100,
    };
    l.check(K, limits, &BanPolicy::default(), T0);
    l.check(K, limits, &BanPolicy::default(), T0);
    for _ in 0..10 {
        assert_eq!(
            l.check(K, limits, &BanPolicy::default(), T0 + 1).verdict,
            Verdict::RateLimited
        );
    }
    let d = l.check(K, limits, &BanPolicy::default(), T0 + 2);
    assert_eq!(d.verdict, Verdict::Banned);
    assert_eq!(d.quota.reset_ms, T0 + 2 + 15 * MINUTE_MS);
    assert_eq!(d.retry_after_secs(T0 + 2), Some(900));
    assert_eq!(
        l.check(K, limits, &BanPolicy::default(), T0 + 14 * MINUTE_MS)
            .verdict,
        Verdict::Banned
    );
    assert_eq!(
        l.check(KeyId(99), limits, &BanPolicy::default(), T0 + 3)
            .verdict,
        Verdict::Admitted
    );
    assert_eq!(
        l.check(K, limits, &BanPolicy::default(), T0 + 2 + 15 * MINUTE_MS)
            .verdict,
        Verdict::Admitted
    );
}

#[test]
fn concurrent_requests_never_exceed_the_limit() {
    let l = Arc::new(Limiter::default());
    let admitted: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let l = l.clone();
                s.spawn(move || {
                    (0..50)
                        .filter(|_| {
                            l.check(K, FREE, &BanPolicy::default(), T0).verdict == Verdict::Admitted
                        })
                        .count() as u64
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(admitted, 60);
}

#[test]
fn peeking_counts_nothing_and_reports_both_windows_and_the_ban() {
    let l = Limiter::default();
    let limits = Limits {
        per_minute: 2,
        per_day: 100,
    };
    let fresh = l.peek(K, limits, T0);
    assert_eq!((fresh.minute.remaining, fresh.day.remaining), (2, 100));
    assert_eq!(fresh.minute.reset_ms, T0 + MINUTE_MS);
    l.check(K, limits, &BanPolicy::default(), T0);
    for _ in 0..3 {
        let p = l.peek(K, limits, T0 + 5);
        assert_eq!(
            (p.minute.remaining, p.day.remaining),
            (1, 99),
            "peeks count nothing"
        );
    }
    l.check(K, limits, &BanPolicy::default(), T0 + 6);
    for _ in 0..11 {
        l.check(K, limits, &BanPolicy::default(), T0 + 7);
    }
    let p = l.peek(K, limits, T0 + 8);
    assert_eq!(p.banned_until_ms, Some(T0 + 7 + 15 * MINUTE_MS));
    assert_eq!(p.headline(limits).remaining, 0);
    let later = l.peek(K, limits, T0 + 7 + 15 * MINUTE_MS);
    assert_eq!((later.banned_until_ms, later.minute.remaining), (None, 2));
    assert_eq!(later.day.remaining, 98);
}

#[test]
fn changes_are_taken_once_and_a_banned_key_refused_is_no_change() {
    let l = Limiter::default();
    let bans = BanPolicy::default();
    let limits = Limits {
        per_minute: 1,
        per_day: 100,
    };
    l.check(K, limits, &bans, T0);
    l.check(KeyId(8), limits, &bans, T0);
    let mut taken = l.changes(&bans, T0);
    taken.sort_by_key(|(id, _)| id.0);
    assert_eq!(taken.iter().map(|(id, _)| id.0).collect::<Vec<_>>(), [7, 8]);
    assert_eq!(taken[0].1.minute_count, 1);
    assert!(l.changes(&bans, T0).is_empty(), "taken once");

    // Refusals count towards the ban until it starts; while it lasts, nothing changes.
    for _ in 0..11 {
        l.check(K, limits, &bans, T0 + 1);
    }
    let banned = l.changes(&bans, T0 + 1);
    assert_eq!(banned.len(), 1);
    assert_eq!(banned[0].1.ban_until_ms, T0 + 1 + 15 * MINUTE_MS);
    l.check(K, limits, &bans, T0 + 2);
    assert!(l.changes(&bans, T0 + 2).is_empty());

    // A snapshot takes every live state and leaves nothing changed; idle keys are dropped.
    l.check(KeyId(8), limits, &bans, T0 + 3);
    let day_later = T0 + 2 * DAY_MS;
    let mut all = Vec::new();
    l.snapshot(&bans, T0 + 3, |id, state| all.push((id, *state)));
    assert_eq!(all.len(), 2);
    assert!(all.iter().all(|(_, state)| !state.changed));
    assert!(l.changes(&bans, T0 + 3).is_empty());
    l.snapshot(&bans, day_later, |_, _| panic!("both idle by then"));
    assert!(l.is_empty());
}

/// More changes than fit in one chunk: each key's latest state, once, whichever chunk
/// it was copied into.
#[test]
fn changes_of_many_keys_are_each_taken_once() {
    let l = Limiter::default();
    let bans = BanPolicy::default();
    let limits = Limits {
        per_minute: 1_000,
        per_day: 1_000,
    };
    let keys = 3 * CHANGES_CHUNK as u64 + 17;
    for k in 0..keys {
        for _ in 0..=k % 3 {
            l.check(KeyId(k), limits, &bans, T0);
        }
    }
    let mut taken = l.changes(&bans, T0);
    taken.sort_by_key(|(id, _)| id.0);
    assert_eq!(taken.len() as u64, keys);
    for (k, (id, state)) in (0..keys).zip(&taken) {
        assert_eq!(id.0, k);
        assert_eq!(u64::from(state.minute_count), k % 3 + 1);
    }
    assert!(l.changes(&bans, T0).is_empty(), "taken once");
}

proptest! {
    /// Whatever the arrival times, no minute window admits more than its limit and no UTC
    /// day more than its quota.
    #[test]
    fn never_more_admitted_than_the_limits(
        gaps in proptest::collection::vec(0u64..40_000, 1..400),
        per_minute in 1u64..20,
        per_day in 1u64..60,
    ) {
        let limits = Limits { per_minute, per_day };
        let l = Limiter::new();
        let never = BanPolicy { threshold: u32::MAX, ..BanPolicy::default() };
        let mut now = T0 - 3_600_000 * 2 + 7;
        // (time, admitted) for every request; windows are recomputed independently below.
        let mut requests = Vec::new();
        for gap in gaps {
            now += gap;
            let d = l.check(K, limits, &never, now);
            requests.push((now, d.verdict == Verdict::Admitted));
            if let Some(retry) = d.retry_after_secs(now) {
                prop_assert!(retry >= 1);
            }
        }
        let mut window_start = None::<u64>;
        let mut in_window = 0;
        for &(t, admitted) in &requests {
            if window_start.is_none_or(|s| t >= s + MINUTE_MS) {
                window_start = Some(t);
                in_window = 0;
            }
            in_window += u64::from(admitted);
            prop_assert!(in_window <= per_minute);
        }
        for &(t, _) in &requests {
            let in_day = requests.iter().filter(|&&(u, a)| a && u / DAY_MS == t / DAY_MS).count();
            prop_assert!(in_day as u64 <= per_day);
        }
    }
}
