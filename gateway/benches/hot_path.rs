//! Microbenchmarks of the gateway's per-request work (`cargo bench -p animal-store-gateway`):
//! the key lookup from the `Authorization` header (one key presented again and again, and a
//! different one of 1,000,000 each time), the limiter's decision with 1 and 1,000,000
//! active keys, and rendering the rate-limit headers; and, printed before them, the memory each
//! active key costs the limiter. Next to the decision at 1M keys, the machine's latency of one
//! load from memory, the floor under that decision.
//! Also the embedded store's once-a-second write at 1,000,000 keys: the pass that takes what
//! changed, and the whole write with the journal's fsync (under `CARGO_TARGET_TMPDIR`, on the
//! disk the build is on); and, printed, how long decisions wait while such passes run, how
//! much memory the limiter gives back once its million keys are forgotten, and how long the
//! first decisions of new keys wait for their shard to grow.

use std::cell::Cell;
use std::hint::black_box;
use std::time::{Duration, Instant};

use animal_store_gateway::auth::authorize;
use animal_store_gateway::bans::BanPolicy;
use animal_store_gateway::headers::{self, HeaderCase};
use animal_store_gateway::key_set::KeySet;
use animal_store_gateway::keys::{KeyId, KeyRecord, generate, hash_key};
use animal_store_gateway::limits::Limiter;
use animal_store_gateway::plans::{Limits, Plans};
use animal_store_gateway::rate_headers::{self, RateHeaders};
use animal_store_gateway::store::embedded::EmbeddedStore;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use pingora::http::ResponseHeader;

const LIMITS: Limits = Limits {
    per_minute: u64::MAX / 2,
    per_day: u64::MAX / 2,
};
/// 2026-11-22T10:00:00Z.
const T0: u64 = 1_795_341_600_000;
const MANY: u64 = 1_000_000;
const DAY_MS: u64 = 86_400_000;

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn record(id: KeyId, key: &str) -> KeyRecord {
    KeyRecord {
        id: id.to_string(),
        name: None,
        plan: "pro".to_owned(),
        per_minute: None,
        per_day: None,
        sha256: hex::encode(hash_key(key)),
        created: 0,
        revoked: None,
        expires: None,
        successor: None,
        counters: None,
    }
}

fn key_lookup(c: &mut Criterion) {
    let keys: Vec<(KeyId, String)> = (0..10_000).map(|_| generate().unwrap()).collect();
    let records: Vec<KeyRecord> = keys.iter().map(|(id, k)| record(*id, k)).collect();
    let set = KeySet::build(&records, &Plans::defaults());
    let header = format!("Bearer {}", keys[4_321].1);
    c.bench_function(
        "key lookup (header parsed, SHA-256, constant-time compare), 10k keys",
        |b| b.iter(|| authorize(Some(black_box(header.as_bytes())), &set, T0).is_ok()),
    );
}

/// The key lookup among [`MANY`] keys, each request presenting a different one (striding through
/// them, as [`next`] does): its map entry and record are rarely in cache, unlike
/// [`key_lookup`]'s one key. Each header is made before its lookup is timed, in a buffer of its
/// own, as a request's header has just been read from the socket.
fn key_lookup_many(c: &mut Criterion) {
    let key = |k: u64| {
        format!(
            "as_{}_{:064x}",
            spread(k),
            u128::from(k) * 0x9e37_79b9_7f4a_7c15
        )
    };
    let records: Vec<KeyRecord> = (0..MANY).map(|k| record(spread(k), &key(k))).collect();
    let set = KeySet::build(&records, &Plans::defaults());
    drop(records);
    assert_eq!(set.len() as u64, MANY, "every key in the set");
    const HEADER_LEN: usize = "Bearer as_".len() + 16 + 1 + 64;
    c.bench_function(
        "key lookup (header parsed, SHA-256, constant-time compare), 1M keys, a different key each time",
        |b| {
            let mut k = 0u64;
            b.iter_batched_ref(
                || {
                    next(&mut k);
                    let mut header = [0u8; HEADER_LEN];
                    header.copy_from_slice(format!("Bearer {}", key(k)).as_bytes());
                    header
                },
                |header| authorize(Some(black_box(&header[..])), &set, T0).is_ok(),
                BatchSize::SmallInput,
            )
        },
    );
}

/// The `k`-th of the many keys, its id spread like the random ids of real keys.
fn spread(k: u64) -> KeyId {
    KeyId(k.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// The next of the many keys after the `k`-th, striding through all of them.
fn next(k: &mut u64) -> KeyId {
    *k = (*k + 7919) % MANY;
    spread(*k)
}

fn limiter(c: &mut Criterion) {
    let bans = BanPolicy::default();
    let one = Limiter::new();
    c.bench_function("limiter decision, 1 active key", |b| {
        let mut now = T0;
        b.iter(|| {
            now += 1;
            black_box(one.check(KeyId(7), LIMITS, &bans, now))
        })
    });

    let before = resident_bytes();
    let many = Limiter::new();
    let growth = fill_timing_growth(&many, &bans);
    let per_key = (resident_bytes().saturating_sub(before)) as f64 / MANY as f64;
    println!(
        "limiter memory: {per_key:.0} bytes per active key at {MANY} keys (resident set growth); \
         the table's own {:.0}",
        many.bytes() as f64 / MANY as f64
    );
    println!("{growth}");
    c.bench_function("limiter decision, 1M active keys", |b| {
        let mut k = 0u64;
        let mut now = T0;
        b.iter(|| {
            now += 1;
            black_box(many.check(next(&mut k), LIMITS, &bans, now))
        })
    });

    memory_latency(c);

    println!("{}", waits_during_passes(&many, &bans));
    println!("{}", growth_with_passes(&bans));

    // What the embedded store does once a second: one pass over every key, copying the
    // changed ones out for the journal.
    ten_thousand_changed(
        c,
        "limiter changes",
        |key| {
            many.check(key, LIMITS, &bans, T0 + 1);
        },
        || {
            black_box(many.changes(&bans, T0 + 1));
        },
    );
    // Two days later every key is idle: the pass forgets them and gives back their slots. This
    // bench allocates with the system's malloc, which returns to the system only what it can
    // trim; the binary's mimalloc returns the rest too (`bench/results.md`).
    let burst = resident_bytes();
    black_box(many.changes(&bans, T0 + 2 * DAY_MS));
    let given_back = burst.saturating_sub(resident_bytes()) as f64 / MANY as f64;
    println!(
        "limiter memory given back to the system once the {MANY} keys are forgotten: \
         {given_back:.0} bytes per key (system malloc); the table keeps {} bytes",
        many.bytes()
    );
    drop(many);

    // The whole write: the pass, the journal batch and its fsync; about one write in a hundred
    // compacts the journal into a new snapshot, and is counted in the mean.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a temporary directory");
    let store = EmbeddedStore::open(dir.path(), bans).expect("an empty store");
    for k in 0..MANY {
        store.check(spread(k), LIMITS, &bans, T0);
    }
    store.persist(T0).expect("the first snapshot");
    ten_thousand_changed(
        c,
        "embedded store write",
        |key| {
            store.check(key, LIMITS, &bans, T0 + 1);
        },
        || {
            store.persist(T0 + 1).expect("a journal batch");
        },
    );
}

/// The machine's memory latency, the floor under a decision among many keys: loads that each
/// depend on the last, along a random cycle over 128 MiB (about what the limiter's states take
/// at 1M keys, in pages as its table gets them), so nearly every one misses every cache. A
/// decision at 1M keys reads its key's state from memory nearly every time, so where one such
/// load takes 250 ns no decision at 1M keys takes 100; measured in the same run, the two say
/// how much of the decision is the machine's.
fn memory_latency(c: &mut Criterion) {
    const LINE_WORDS: usize = 64 / std::mem::size_of::<usize>();
    let lines = (128 << 20) / 64;
    // A random order of the lines (xorshift: reproducible, and no dependency for a shuffle).
    let mut order: Vec<usize> = (0..lines).collect();
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    for i in (1..lines).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    // Each line's first word holds the index of the next line's first word in that order.
    let mut chase = vec![0usize; lines * LINE_WORDS];
    for (i, &line) in order.iter().enumerate() {
        chase[line * LINE_WORDS] = order[(i + 1) % lines] * LINE_WORDS;
    }
    drop(order);
    c.bench_function(
        "one dependent load from memory, 128 MiB (the machine's floor for a decision)",
        |b| {
            let mut at = 0;
            b.iter(|| {
                at = chase[black_box(at)];
                at
            })
        },
    );
}

/// Benchmarks `write` (group `name`) after each batch of 10,000 of the many keys has been
/// `count`ed, striding through all of them.
fn ten_thousand_changed(
    c: &mut Criterion,
    name: &str,
    count: impl Fn(KeyId),
    mut write: impl FnMut(),
) {
    let mut group = c.benchmark_group(name);
    group.sample_size(20);
    group.bench_function("10k of 1M active keys changed", |b| {
        let mut k = 0u64;
        b.iter_batched(
            || (0..10_000).for_each(|_| count(next(&mut k))),
            |()| write(),
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

/// Gives `many` its keys, timing each one's first decision, and meanwhile, on another thread,
/// decisions of keys it has already. The slowest first decisions are those that grew their
/// shard: its new slots are made with the shard let go, but the keys move in under its lock,
/// and the other thread's decisions for that shard wait for that. Counted as they come, so
/// nothing here adds to the memory measured around it.
fn fill_timing_growth(many: &Limiter, bans: &BanPolicy) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    let filled = AtomicU64::new(0);
    let (new, meanwhile) = std::thread::scope(|s| {
        let others = s.spawn(|| {
            let waits = Slow::default();
            let mut k = 0u64;
            loop {
                let have = filled.load(Ordering::Relaxed);
                if have == MANY {
                    break waits;
                }
                if have > 0 {
                    k = (k + 7_919) % have;
                    waits.time(|| many.check(spread(k), LIMITS, bans, T0));
                }
            }
        });
        let first = Slow::default();
        for k in 0..MANY {
            first.time(|| many.check(spread(k), LIMITS, bans, T0));
            filled.store(k + 1, Ordering::Relaxed);
        }
        (first, others.join().expect("the other thread's decisions"))
    });
    format!(
        "limiter growth to {MANY} keys: first decisions of new keys {}; meanwhile, decisions of \
         keys already in (another thread) {}",
        new.report(),
        meanwhile.report()
    )
}

/// New keys at a steady pace, [`PACED_KEYS_PER_SECOND`], to a fresh limiter of [`MANY`], each
/// one's first decision timed, while another thread makes the embedded store's pass every
/// [`PASS_EVERY`]: a pass grows a shard it finds nearly full, so that at this pace no first
/// decision has to (unlike [`fill_timing_growth`]'s, which come with no pass).
fn growth_with_passes(bans: &BanPolicy) -> String {
    use std::sync::atomic::{AtomicBool, Ordering};
    let before = resident_bytes();
    let paced = Limiter::new();
    let filling = AtomicBool::new(true);
    let first = std::thread::scope(|s| {
        s.spawn(|| {
            while filling.load(Ordering::Relaxed) {
                std::thread::sleep(PASS_EVERY);
                black_box(paced.changes(bans, T0));
            }
        });
        let first = Slow::default();
        let started = Instant::now();
        const BATCH: u64 = 100;
        for batch in 0..MANY / BATCH {
            let due = Duration::from_secs_f64((batch * BATCH) as f64 / PACED_KEYS_PER_SECOND);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
            for k in batch * BATCH..(batch + 1) * BATCH {
                first.time(|| paced.check(spread(k), LIMITS, bans, T0));
            }
        }
        filling.store(false, Ordering::Relaxed);
        first
    });
    let per_key = (resident_bytes().saturating_sub(before)) as f64 / MANY as f64;
    format!(
        "limiter growth to {MANY} keys at {PACED_KEYS_PER_SECOND} new keys a second, a pass every \
         {PASS_EVERY:?}: first decisions of new keys {}; {per_key:.0} bytes per key (resident set \
         growth), the table's own {:.0}",
        first.report(),
        paced.bytes() as f64 / MANY as f64
    )
}

/// The pace of [`growth_with_passes`]'s new keys, and how often its passes come: at a million
/// keys, a shard's early growth (from 13/16 full to 7/8) leaves room for about 75,000 new keys
/// across the table between two passes; this brings 25,000.
const PACED_KEYS_PER_SECOND: f64 = 100_000.0;
const PASS_EVERY: Duration = Duration::from_millis(250);

/// Decisions timed as they come: how many, and those slower than [`Slow::OVER`].
#[derive(Default)]
struct Slow {
    count: Cell<u64>,
    slow: Cell<u64>,
    slow_total: Cell<Duration>,
    slowest: Cell<Duration>,
}

impl Slow {
    /// A decision alone takes well under 1 µs: one over this waited for something.
    const OVER: Duration = Duration::from_micros(100);

    fn time<T>(&self, decide: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let decision = black_box(decide());
        let took = started.elapsed();
        self.count.set(self.count.get() + 1);
        if took > Self::OVER {
            self.slow.set(self.slow.get() + 1);
            self.slow_total.set(self.slow_total.get() + took);
        }
        self.slowest.set(self.slowest.get().max(took));
        decision
    }

    fn report(&self) -> String {
        let slow = self.slow.get();
        format!(
            "{}, of them {slow} over {:?} (mean {:?}), the slowest {:?}",
            self.count.get(),
            Self::OVER,
            self.slow_total.get() / u32::try_from(slow.max(1)).unwrap_or(u32::MAX),
            self.slowest.get(),
        )
    }
}

/// How long decisions take while another thread makes the embedded store's pass over `many`
/// again and again: the pass locks each shard of the map in turn, and a decision for a key of
/// the locked shard waits for it.
fn waits_during_passes(many: &Limiter, bans: &BanPolicy) -> String {
    use std::sync::atomic::{AtomicBool, Ordering};
    let passing = AtomicBool::new(true);
    let mut took = Vec::with_capacity(4_000_000);
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..20 {
                black_box(many.changes(bans, T0 + 1));
            }
            passing.store(false, Ordering::Relaxed);
        });
        let mut k = 0u64;
        while passing.load(Ordering::Relaxed) {
            let started = Instant::now();
            black_box(many.check(next(&mut k), LIMITS, bans, T0 + 1));
            took.push(started.elapsed());
        }
    });
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
    format!(
        "limiter decisions during 20 passes over 1M keys: {} decisions, p99 {:?}, p99.9 {:?}, max {:?}",
        took.len(),
        at(0.99),
        at(0.999),
        took[took.len() - 1]
    )
}

fn headers(c: &mut Criterion) {
    let rate = RateHeaders {
        name: "minute",
        limit: 300,
        remaining: 297,
        reset_ms: 1_795_341_660_000,
        policy: rate_headers::key_policy(Limits {
            per_minute: 300,
            per_day: 10_000,
        }),
    };
    // Each written to the wire as pingora writes an HTTP/1 head: over HTTP/1 the gateway's
    // headers are lines made as they are added, in a map they are written at this step.
    for (case, http2, label) in [
        (
            HeaderCase::Preserve,
            false,
            "rate-limit headers on a response, written (header_case = preserve)",
        ),
        (
            HeaderCase::Lower,
            false,
            "rate-limit headers on a response, written (header_case = lower)",
        ),
        (
            HeaderCase::Preserve,
            true,
            "rate-limit headers on a response, in the map of an HTTP/2 response",
        ),
    ] {
        c.bench_function(label, |b| {
            let mut wire = Vec::with_capacity(1024);
            b.iter(|| {
                let mut r = ResponseHeader::build(200, Some(8)).unwrap();
                headers::with_response_headers(&mut r, case, http2, |h| {
                    rate_headers::insert(h, black_box(&rate), 1_795_341_618_000)
                })
                .unwrap();
                wire.clear();
                if !http2 {
                    r.header_to_h1_wire(&mut wire);
                }
                black_box((r, wire.len()))
            })
        });
    }
}

// The million keys' lookup comes last, so that its key set (hundreds of MB, given back) is
// not what the limiter's tables are placed among.
criterion_group!(benches, key_lookup, limiter, headers, key_lookup_many);
criterion_main!(benches);
