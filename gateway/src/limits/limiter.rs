//! [`Limiter`]: every key's [`KeyState`] in this process's memory, for the embedded store (which
//! persists it) and for the Redis store's fallback when Redis cannot be reached. The algorithm
//! each decision runs is [`KeyState::check`], in the parent module.

use super::{Decision, KeyState, Standing, Verdict};
use crate::bans::BanPolicy;
use crate::keys::KeyId;
use crate::plans::Limits;
use crate::state_table::StateTable;

/// Changed states a chunk of [`Limiter::changes`] holds (56 KiB).
pub(super) const CHANGES_CHUNK: usize = 1024;

/// Every key's state in this process's memory, each decision under the lock of its key's shard
/// of the table ([`StateTable`]), so no two decisions of one key interleave. Memory grows only
/// with valid keys: a request reaches the limiter only after its key was found in the key store.
/// It shrinks again as the store's passes forget idle keys (their minute and UTC day over, no
/// ban to remember): a shard of the table left at most a quarter full gives back most of its
/// slots.
/// The ban rules come with each call, from the request's configuration, so a reload changes
/// them.
///
/// The embedded store's pass locks one shard at a time, for at most 512 slots before it lets
/// waiting decisions in: a decision for a key of that shard waits a few µs (p99.9 under 60 µs at
/// a million keys, while passes run back to back).
#[derive(Debug, Default)]
pub struct Limiter {
    states: StateTable<KeyState>,
}

impl Limiter {
    /// An empty limiter.
    pub fn new() -> Limiter {
        Limiter::default()
    }

    /// Checks and, if admitted, counts one request of `key` at `now_ms` (Unix milliseconds).
    pub fn check(&self, key: KeyId, limits: Limits, bans: &BanPolicy, now_ms: u64) -> Decision {
        self.states.with(key.0, |state| {
            let decision = state.check(limits, bans, now_ms);
            // A banned key's refusals change nothing, and leave nothing to write.
            if decision.verdict != Verdict::Banned || decision.ban_imposed {
                state.changed = true;
            }
            decision
        })
    }

    /// Gives `key` the state `start` makes, unless it has one.
    pub fn start(&self, key: KeyId, start: impl FnOnce() -> KeyState) {
        self.states.insert_if_absent(key.0, start);
    }

    /// Where `key` stands at `now_ms`, counting nothing.
    pub fn peek(&self, key: KeyId, limits: Limits, now_ms: u64) -> Standing {
        self.states
            .get(key.0)
            .unwrap_or_default()
            .peek(limits, now_ms)
    }

    /// The states that changed since the last call (or [`Limiter::snapshot`]), which no longer
    /// count as changed; idle state is forgotten on the way. One pass over the keys, copying
    /// only the changed ones.
    pub fn changes(&self, bans: &BanPolicy, now_ms: u64) -> Vec<(KeyId, KeyState)> {
        // Copied into chunks that never grow, and joined after the pass: a vector that grew
        // under a shard's lock would copy everything taken so far while decisions of that shard
        // wait (`cargo bench`: up to 9 ms at 1M keys).
        let mut chunks: Vec<Vec<(KeyId, KeyState)>> = Vec::new();
        self.sweep(bans, now_ms, |id, state| {
            if state.changed {
                state.changed = false;
                match chunks.last_mut() {
                    Some(chunk) if chunk.len() < chunk.capacity() => chunk.push((id, *state)),
                    _ => {
                        let mut chunk = Vec::with_capacity(CHANGES_CHUNK);
                        chunk.push((id, *state));
                        chunks.push(chunk);
                    }
                }
            }
        });
        chunks.concat()
    }

    /// Hands `take` every key's state that still matters at `now_ms` under `bans`, none of
    /// which counts as changed any more; idle state is forgotten on the way. A callback rather
    /// than a vector: a snapshot of a million keys is encoded as it is taken, not copied first.
    pub fn snapshot(&self, bans: &BanPolicy, now_ms: u64, mut take: impl FnMut(KeyId, &KeyState)) {
        self.sweep(bans, now_ms, |id, state| {
            state.changed = false;
            take(id, state);
        });
    }

    /// One pass over the keys, a shard at a time: idle state at `now_ms` is forgotten, every
    /// other state is handed to `visit`.
    fn sweep(&self, bans: &BanPolicy, now_ms: u64, mut visit: impl FnMut(KeyId, &mut KeyState)) {
        self.states.retain(|id, state| {
            if state.is_idle(bans, now_ms) {
                return false;
            }
            visit(KeyId(id), state);
            true
        });
    }

    /// How many keys have state, idle or not.
    pub fn len(&self) -> usize {
        self.states.len()
    }

    /// Whether no key has state.
    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// The bytes of the table that holds the keys' states ([`StateTable::bytes`]).
    pub fn bytes(&self) -> usize {
        self.states.bytes()
    }

    /// Puts back the states of a snapshot, as unchanged.
    pub fn restore(&self, states: impl IntoIterator<Item = (KeyId, KeyState)>) {
        for (key, state) in states {
            self.states.insert(
                key.0,
                KeyState {
                    changed: false,
                    ..state
                },
            );
        }
    }

    /// Forgets every key's state.
    pub fn clear(&self) {
        self.states.clear();
    }
}
