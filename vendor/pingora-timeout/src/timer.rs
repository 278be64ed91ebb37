// Copyright 2026 Cloudflare, Inc.
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
// http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

//! Lightweight timer for systems with high rate of operations with timeout
//! associated with them
//!
//! Users don't need to interact with this module.
//!
//! The idea is to bucket timers into finite time slots so that operations that
//! start and end quickly don't have to create their own timers all the time
//!
//! Benchmark:
//! - create 7.809622ms total, 78ns avg per iteration
//! - drop: 1.348552ms total, 13ns avg per iteration
//!
//! tokio timer:
//! - create 34.317439ms total, 343ns avg per iteration
//! - drop: 10.694154ms total, 106ns avg per iteration

use parking_lot::RwLock;
use pin_project_lite::pin_project;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use thread_local::ThreadLocal;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

/// Animal Store's patch to pingora-timeout 0.9.1 (see `vendor/README.md`): the clock thread's
/// watchdog reads the kernel's coarse monotonic clock, not the precise one.
///
/// Every `fast_timeout()` reads the time to check that the clock thread is alive: about five
/// reads a proxied request with upstream read and write timeouts, at 20-25 ns each through the
/// vDSO. The watchdog counts whole seconds and allows two, so `CLOCK_MONOTONIC_COARSE` (the
/// time of the kernel's last timekeeping update, a few ns to read) serves it. Timers' deadlines
/// stay on the precise clock: the coarse one lags it by more than its stated resolution (one
/// tick, 4 ms) on a virtual machine, 4-8 ms on a busy one here and up to 24 ms with its CPUs
/// contended, which would let a deadline taken from it pass early.
pub(crate) mod coarse {
    use std::time::Duration;

    /// The time since an unspecified point, never going back, behind the precise monotonic
    /// clock by some milliseconds.
    #[cfg(target_os = "linux")]
    #[inline]
    pub fn now() -> Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec, and CLOCK_MONOTONIC_COARSE exists on
        // every Linux since 2.6.32, so the call cannot fail.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
        debug_assert_eq!(rc, 0);
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    /// Elsewhere, the precise clock, measured from the first read.
    #[cfg(not(target_os = "linux"))]
    pub fn now() -> Duration {
        use once_cell::sync::Lazy;
        static START: Lazy<std::time::Instant> = Lazy::new(std::time::Instant::now);
        START.elapsed()
    }
}

const RESOLUTION_MS: u64 = 10;
const RESOLUTION_DURATION: Duration = Duration::from_millis(RESOLUTION_MS);

// round to the NEXT timestamp based on the resolution
// Animal Store's patch: in `u64`, which the compiler divides by a constant with a multiply; the
// published crate's `u128` called a 128-bit division routine (`__udivti3`) for each timer made.
#[inline]
fn round_to(raw: u64, resolution: u64) -> u64 {
    raw - 1 + resolution - (raw - 1) % resolution
}
// millisecond resolution as most
#[derive(PartialEq, PartialOrd, Eq, Ord, Clone, Copy, Debug)]
struct Time(u64);

impl From<u64> for Time {
    fn from(raw_ms: u64) -> Self {
        Time(round_to(raw_ms, RESOLUTION_MS))
    }
}

impl From<Duration> for Time {
    fn from(d: Duration) -> Self {
        Time(round_to(d.as_millis() as u64, RESOLUTION_MS))
    }
}

impl Time {
    /// Animal Store's patch: the tick a timer due `since_zero` fires at. Its part of a
    /// millisecond is rounded up, where `Time::from(Duration)` drops it, so a timer never fires
    /// before its duration: it could fire up to a millisecond early.
    fn deadline(since_zero: Duration) -> Time {
        let ms =
            since_zero.as_secs() * 1000 + u64::from(since_zero.subsec_nanos().div_ceil(1_000_000));
        ms.max(1).into()
    }

    pub fn not_after(&self, ts: u64) -> bool {
        self.0 <= ts
    }
}

/// Animal Store's patch: a tick's timer, shared by every timer due at the tick. A stub is one
/// `Arc` to it; the published crate's stub was two (the `Notify` and the flag, each in an `Arc`
/// of its own), cloned and dropped for each timer made.
struct Tick {
    /// In an `Arc` of its own, which a waiting timer holds (`Notify::notified_owned`).
    notify: Arc<Notify>,
    fired: AtomicBool,
}

/// the stub for waiting for a timer to be expired.
#[derive(Clone)]
pub struct TimerStub(Arc<Tick>);

impl TimerStub {
    /// Wait for the timer to expire.
    pub async fn poll(self) {
        self.wait().await
    }

    /// Animal Store's patch: the wait for this timer, as a future that allocates nothing and
    /// can be held in place (see `Timeout`).
    ///
    /// The wait is made before the flag is read, so a timer that fires after the read wakes it:
    /// the published crate read the flag first, and a timer fired between the read and the
    /// wait's making was never seen.
    pub fn wait(&self) -> TimerWait {
        let notified = self.0.notify.clone().notified_owned();
        if self.0.fired.load(Ordering::SeqCst) {
            TimerWait::Fired
        } else {
            TimerWait::Waiting { notified }
        }
    }
}

pin_project! {
    /// Animal Store's patch: the future of [`TimerStub::wait`], ready once the timer has fired.
    #[project = TimerWaitProj]
    pub enum TimerWait {
        Fired,
        Waiting {
            #[pin]
            notified: OwnedNotified,
        },
    }
}

impl Future for TimerWait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.project() {
            TimerWaitProj::Fired => Poll::Ready(()),
            TimerWaitProj::Waiting { notified } => notified.poll(cx),
        }
    }
}

struct Timer(Arc<Tick>);

impl Timer {
    pub fn new() -> Self {
        Timer(Arc::new(Tick {
            notify: Arc::new(Notify::new()),
            fired: AtomicBool::new(false),
        }))
    }

    pub fn fire(&self) {
        self.0.fired.store(true, Ordering::SeqCst);
        self.0.notify.notify_waiters();
    }

    pub fn subscribe(&self) -> TimerStub {
        TimerStub(self.0.clone())
    }
}

/// The object that holds all the timers registered to it.
pub struct TimerManager {
    // each thread insert into its local timer tree to avoid lock contention
    timers: ThreadLocal<RwLock<BTreeMap<Time, Timer>>>,
    zero: Instant, // the reference zero point of Timestamp
    // Animal Store's patch: the watchdog's zero point, on the coarse clock.
    watchdog_zero: Duration,
    // Start a new clock thread if this is -1 or staled. The clock thread should keep updating this
    clock_watchdog: AtomicI64,
    paused: AtomicBool,
    // Animal Store's patch: this manager among all, for the threads' `RECENT` timers.
    id: u64,
}

thread_local! {
    /// Animal Store's patch: the timers this thread registered last, each by its manager's id and
    /// its tick.
    ///
    /// Timers due at the same tick share one timer, found in the thread's tree (a lock and a
    /// search of a tree of every tick pending, some 500 instructions). A thread mostly registers
    /// the same few timeouts again and again (a proxy: its upstreams' read timeout, and its pooled
    /// connections' idle timeout), so the next timer is nearly always due at one of the last two
    /// ticks, and shares that timer without the tree.
    ///
    /// A timer found here is the tree's own for that tick, or the one the clock thread took out of
    /// the tree when it fired it. It fired only once its tick had passed, so a timer due at that
    /// tick is due already, as it would be if made anew: never early.
    #[allow(clippy::type_complexity)]
    static RECENT: RefCell<[Option<(u64, Time, TimerStub)>; 2]> = const { RefCell::new([None, None]) };
}

/// Animal Store's patch: the next manager's `id`.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

// Consider the clock thread is dead after it fails to update the thread in DELAYS_SEC
const DELAYS_SEC: i64 = 2; // TODO: make sure this value is larger than RESOLUTION_DURATION

impl Default for TimerManager {
    fn default() -> Self {
        TimerManager {
            timers: ThreadLocal::new(),
            zero: Instant::now(),
            watchdog_zero: coarse::now(),
            clock_watchdog: AtomicI64::new(-DELAYS_SEC),
            paused: AtomicBool::new(false),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }
}

impl TimerManager {
    /// Create a new [TimerManager]
    pub fn new() -> Self {
        Self::default()
    }

    // This thread sleeps for a resolution time and then fires all the timers that are due to fire
    pub(crate) fn clock_thread(&self) {
        loop {
            std::thread::sleep(RESOLUTION_DURATION);
            let now = Instant::now() - self.zero;
            // Animal Store's patch: the watchdog on the clock its readers read.
            self.clock_watchdog
                .store(self.watchdog_secs(), Ordering::Relaxed);
            if self.is_paused_for_fork() {
                // just stop acquiring the locks, waiting for fork to happen
                continue;
            }
            let now = now.as_millis() as u64;
            // iterate through the timer tree for all threads
            for thread_timer in self.timers.iter() {
                let mut timers = thread_timer.write();
                // Fire all timers until now
                loop {
                    let key_to_remove = timers.iter().next().and_then(|(k, _)| {
                        if k.not_after(now) {
                            Some(*k)
                        } else {
                            None
                        }
                    });
                    if let Some(k) = key_to_remove {
                        let timer = timers.remove(&k);
                        // safe to unwrap, the key is from iter().next()
                        timer.unwrap().fire();
                    } else {
                        break;
                    }
                }
                // write lock drops here
            }
        }
    }

    // False if the clock is already started
    // If true, the caller must start the clock thread next
    pub(crate) fn should_i_start_clock(&self) -> bool {
        let Err(prev) = self.is_clock_running() else {
            return false;
        };
        let now = self.watchdog_secs();
        let res =
            self.clock_watchdog
                .compare_exchange(prev, now, Ordering::SeqCst, Ordering::SeqCst);
        res.is_ok()
    }

    // Ok(()) if clock is running (watch dog is within DELAYS_SEC of now)
    // Err(time) if watch do stopped at `time`
    pub(crate) fn is_clock_running(&self) -> Result<(), i64> {
        let now = self.watchdog_secs();
        let prev = self.clock_watchdog.load(Ordering::SeqCst);
        if now < prev + DELAYS_SEC {
            Ok(())
        } else {
            Err(prev)
        }
    }

    /// Animal Store's patch: whole seconds since this manager was made, by the coarse clock.
    fn watchdog_secs(&self) -> i64 {
        (coarse::now() - self.watchdog_zero).as_secs() as i64
    }

    /// Register a timer.
    ///
    /// When the timer expires, the [TimerStub] will be notified.
    pub fn register_timer(&self, duration: Duration) -> TimerStub {
        self.with_timer(duration, TimerStub::clone)
    }

    /// Animal Store's patch: register a timer, and wait for it ([`TimerStub::wait`]) without
    /// taking a stub of its own.
    pub fn wait_timer(&self, duration: Duration) -> TimerWait {
        self.with_timer(duration, TimerStub::wait)
    }

    /// `with` applied to the timer due `duration` from now.
    fn with_timer<R>(&self, duration: Duration, with: impl FnOnce(&TimerStub) -> R) -> R {
        if self.is_paused_for_fork() {
            // Return a dummy TimerStub that will trigger right away.
            // This is fine assuming pause_for_fork() is called right before fork().
            // The only possible register_timer() is from another thread which will
            // be entirely lost after fork()
            // TODO: buffer these register calls instead (without a lock)
            let timer = Timer::new();
            timer.fire();
            return with(&timer.subscribe());
        }
        // Animal Store's patch: see `Time::deadline`.
        let now = Time::deadline(Instant::now() + duration - self.zero);
        // Animal Store's patch: see `RECENT`.
        RECENT.with(|recent| {
            let mut recent = recent.borrow_mut();
            if let Some((_, _, stub)) = recent
                .iter()
                .flatten()
                .find(|(id, tick, _)| *id == self.id && *tick == now)
            {
                return with(stub);
            }
            let stub = self.register_in_tree(now);
            let made = with(&stub);
            // The older of the two gives way.
            recent.swap(0, 1);
            recent[0] = Some((self.id, now, stub));
            made
        })
    }

    /// The timer due at the tick `now`: the tree's, or a new one put in it.
    fn register_in_tree(&self, now: Time) -> TimerStub {
        {
            let timers = self.timers.get_or(|| RwLock::new(BTreeMap::new())).read();
            if let Some(t) = timers.get(&now) {
                return t.subscribe();
            }
        } // drop read lock

        let timer = Timer::new();
        let mut timers = self.timers.get_or(|| RwLock::new(BTreeMap::new())).write();
        // Usually we check if another thread has insert the same node before we get the write lock,
        // but because only this thread will insert anything to its local timers tree, there
        // is no possible race that can happen. The only other thread is the clock thread who
        // only removes timer from the tree
        let stub = timer.subscribe();
        timers.insert(now, timer);
        stub
    }

    fn is_paused_for_fork(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Pause the timer for fork()
    ///
    /// Because RwLock across fork() is undefined behavior, this function makes sure that no one
    /// holds any locks.
    ///
    /// This function should be called right before fork().
    pub fn pause_for_fork(&self) {
        self.paused.store(true, Ordering::SeqCst);
        // wait for everything to get out of their locks
        std::thread::sleep(RESOLUTION_DURATION * 2);
    }

    /// Unpause the timer after fork()
    ///
    /// This function should be called right after fork().
    pub fn unpause(&self) {
        self.paused.store(false, Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_round() {
        assert_eq!(round_to(30, 10), 30);
        assert_eq!(round_to(31, 10), 40);
        assert_eq!(round_to(29, 10), 30);
    }

    #[test]
    fn test_time() {
        let t: Time = 128u64.into(); // t will round to 130
        assert_eq!(t, Duration::from_millis(130).into());
        assert!(!t.not_after(128));
        assert!(!t.not_after(129));
        assert!(t.not_after(130));
        assert!(t.not_after(131));
    }

    #[tokio::test]
    async fn test_timer_manager() {
        let tm_a = Arc::new(TimerManager::new());
        let tm = tm_a.clone();
        std::thread::spawn(move || tm_a.clock_thread());

        let now = Instant::now();
        let t1 = tm.register_timer(Duration::from_secs(1));
        let t2 = tm.register_timer(Duration::from_secs(1));
        t1.poll().await;
        assert_eq!(now.elapsed().as_secs(), 1);
        let now = Instant::now();
        t2.poll().await;
        // t2 fired along t1 so no extra wait time
        assert_eq!(now.elapsed().as_secs(), 0);
    }

    #[test]
    fn test_timer_manager_start_check() {
        let tm = Arc::new(TimerManager::new());
        assert!(tm.should_i_start_clock());
        assert!(!tm.should_i_start_clock());
        assert!(tm.is_clock_running().is_ok());
    }

    #[test]
    fn test_timer_manager_watchdog() {
        let tm = Arc::new(TimerManager::new());
        assert!(tm.should_i_start_clock());
        assert!(!tm.should_i_start_clock());

        // we don't actually start the clock thread, sleep for the watchdog to expire
        std::thread::sleep(Duration::from_secs(DELAYS_SEC as u64 + 1));
        assert!(tm.is_clock_running().is_err());
        assert!(tm.should_i_start_clock());
    }

    // Animal Store's patch: a deadline's part of a millisecond moves it to the next tick.
    #[test]
    fn deadlines_round_their_part_of_a_millisecond_up() {
        assert_eq!(Time::deadline(Duration::from_millis(20)), Time(20));
        assert_eq!(Time::deadline(Duration::from_nanos(20_000_001)), Time(30));
        assert_eq!(Time::deadline(Duration::from_micros(29_999)), Time(30));
        assert_eq!(Time::deadline(Duration::from_micros(30_500)), Time(40));
        assert_eq!(Time::deadline(Duration::ZERO), Time(10));
    }

    // Animal Store's patch: a timer is shared only with the same manager's timers of its tick.
    #[tokio::test]
    async fn recent_timers_are_shared_only_within_their_manager() {
        let ticking = Arc::new(TimerManager::new());
        let clock = ticking.clone();
        std::thread::spawn(move || clock.clock_thread());
        // Made together, the two count their ticks from nearly the same instant; this one's
        // clock thread never runs, so none of its timers fires.
        let stopped = TimerManager::new();
        let duration = Duration::from_millis(30);
        let first = ticking.register_timer(duration);
        let again = ticking.register_timer(duration);
        let other = stopped.register_timer(duration);
        let start = Instant::now();
        first.poll().await;
        again.poll().await;
        assert!(start.elapsed() < Duration::from_millis(500));
        let waited = tokio::time::timeout(Duration::from_millis(200), other.poll()).await;
        assert!(waited.is_err(), "a stopped manager's timer fired");
    }

    // Animal Store's patch: a wait made before its timer fires is woken by the fire, and one made
    // after it is ready at once.
    #[test]
    fn waits_see_their_timer_fire_whenever_they_were_made() {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let timer = Timer::new();
        let stub = timer.subscribe();
        let mut before = std::pin::pin!(stub.wait());
        assert!(before.as_mut().poll(&mut cx).is_pending());
        let mut made_before_polled = std::pin::pin!(stub.wait());
        timer.fire();
        assert!(before.as_mut().poll(&mut cx).is_ready());
        assert!(made_before_polled.as_mut().poll(&mut cx).is_ready());
        assert!(std::pin::pin!(stub.wait()).poll(&mut cx).is_ready());
    }

    // Animal Store's patch: a timer never fires before its duration has passed.
    #[tokio::test]
    async fn timers_never_fire_early() {
        let tm_a = Arc::new(TimerManager::new());
        let tm = tm_a.clone();
        std::thread::spawn(move || tm_a.clock_thread());

        for i in 0..60u32 {
            // Registered at every phase of a millisecond and of the timer's tick.
            let phase = Instant::now();
            while phase.elapsed() < Duration::from_micros(u64::from(i) * 170) {
                std::hint::spin_loop();
            }
            let duration = Duration::from_millis(u64::from(1 + i % 12));
            let start = Instant::now();
            tm.register_timer(duration).poll().await;
            let waited = start.elapsed();
            assert!(
                waited >= duration,
                "{duration:?} timer fired after {waited:?}"
            );
            // A tick of the timer and the clock thread's own sleep late; generous, as the
            // machine may be busy.
            assert!(waited < duration + Duration::from_millis(500), "{waited:?}");
        }
    }

    // Animal Store's patch: the watchdog's clock keeps time with the precise one, well within
    // the watchdog's two seconds.
    #[test]
    fn coarse_clock_keeps_time_for_the_watchdog() {
        let (coarse_start, start) = (coarse::now(), Instant::now());
        std::thread::sleep(Duration::from_millis(1200));
        let (coarse_end, end) = (coarse::now(), Instant::now());
        let coarse_took = coarse_end - coarse_start;
        let took = end - start;
        let apart = coarse_took.abs_diff(took);
        assert!(
            apart < Duration::from_millis(250),
            "{coarse_took:?} {took:?}"
        );
    }

    #[tokio::test]
    async fn test_timer_manager_pause() {
        let tm_a = Arc::new(TimerManager::new());
        let tm = tm_a.clone();
        std::thread::spawn(move || tm_a.clock_thread());

        let now = Instant::now();
        let t1 = tm.register_timer(Duration::from_secs(2));
        tm.pause_for_fork();
        // no actual fork happen, we just test that pause and unpause work

        // any timer in this critical section is timed out right away
        let t2 = tm.register_timer(Duration::from_secs(2));
        t2.poll().await;
        assert_eq!(now.elapsed().as_secs(), 0);

        std::thread::sleep(Duration::from_secs(1));
        tm.unpause();
        t1.poll().await;
        assert_eq!(now.elapsed().as_secs(), 2);
    }
}
