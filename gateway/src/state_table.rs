//! The limiter's map from key ids to their state: shards of open-addressed tables whose slots
//! are one cache line each, the key beside its value.
//!
//! A decision among a million keys reads its key's slot from memory, and that read is most of its
//! time (`bench/results.md`: a decision costs about 0.7 of one load from memory). A SwissTable,
//! such as `DashMap`'s, keeps a key's control byte apart from its entry, so a lookup reads two
//! places, the second found only by the first. Here a lookup reads the slot its hash points to,
//! and, only if another key holds that slot, the next ones (linear probing). With a key, its mark
//! and its state (57 bytes) in a 64-byte slot, a table that is at most 7/8 full and grows by half
//! takes 73 to 110 bytes a key (`DashMap`'s entries with their control bytes took 120-125 at a
//! million keys; `cargo bench` measures 88 here).
//!
//! Each shard is a table under its own mutex, so decisions of different shards never wait for
//! each other, and a pass over every key ([`StateTable::retain`]) holds one shard at a time.
//! Removal shifts the slots after it back (no tombstones), so a table that forgets idle keys
//! stays as fast to search as a fresh one.

use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Number of shards: a power of two, taken from the low bits of a key's hash.
const SHARDS: usize = 256;

/// A shard's slots when it is first used.
const FIRST_CAPACITY: usize = 8;

/// A table of `V` by 64-bit key, in [`SHARDS`] shards.
pub struct StateTable<V> {
    shards: Box<[Mutex<Shard<V>>]>,
    /// Random for each table: the keys are random ids already, and this keeps them so.
    hasher: foldhash::fast::RandomState,
}

/// One key's slot: a cache line when `V` is at most 48 bytes.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Slot<V> {
    key: u64,
    used: bool,
    value: V,
}

struct Shard<V> {
    slots: Vec<Slot<V>>,
    len: usize,
}

impl<V: Copy + Default> Shard<V> {
    fn empty_slots(capacity: usize) -> Vec<Slot<V>> {
        vec![
            Slot {
                key: 0,
                used: false,
                value: V::default(),
            };
            capacity
        ]
    }

    /// Where a key with hash `hash` belongs in `capacity` slots: the hash's high bits scaled to
    /// the capacity, which need not be a power of two.
    fn home(hash: u64, capacity: usize) -> usize {
        ((u128::from(hash) * capacity as u128) >> 64) as usize
    }

    /// The index of `key`'s slot, or of the empty slot where it would go.
    fn find(&self, key: u64, hash: u64) -> (usize, bool) {
        let capacity = self.slots.len();
        let mut i = Self::home(hash, capacity);
        loop {
            let slot = &self.slots[i];
            if !slot.used {
                return (i, false);
            }
            if slot.key == key {
                return (i, true);
            }
            i += 1;
            if i == capacity {
                i = 0;
            }
        }
    }

    /// Room for one more key: at most 7/8 full, growing by half (the first time, to
    /// [`FIRST_CAPACITY`]).
    fn reserve_one(&mut self, hash_of: &impl Fn(u64) -> u64) {
        let capacity = self.slots.len();
        if (self.len + 1) * 8 <= capacity * 7 {
            return;
        }
        self.rebuild((capacity + capacity / 2).max(FIRST_CAPACITY), hash_of);
    }

    /// Gives back most of the slots of a shard that forgot most of its keys. A shard at most a
    /// quarter full is rebuilt half full, so it neither shrinks again nor grows soon after; one
    /// left empty keeps no slots.
    fn shrink_if_sparse(&mut self, hash_of: &impl Fn(u64) -> u64) {
        let capacity = self.slots.len();
        if self.len == 0 {
            self.slots = Vec::new();
        } else if capacity > FIRST_CAPACITY && self.len * 4 <= capacity {
            self.rebuild((self.len * 2).max(FIRST_CAPACITY), hash_of);
        }
    }

    /// Moves every key into `capacity` new slots, which must be more than the keys.
    fn rebuild(&mut self, capacity: usize, hash_of: &impl Fn(u64) -> u64) {
        let old = std::mem::replace(&mut self.slots, Self::empty_slots(capacity));
        for slot in old.into_iter().filter(|s| s.used) {
            let (i, _) = self.find(slot.key, hash_of(slot.key));
            self.slots[i] = slot;
        }
    }

    /// `key`'s value, made by `make` if it has none.
    fn entry(
        &mut self,
        key: u64,
        hash: u64,
        hash_of: &impl Fn(u64) -> u64,
        make: impl FnOnce() -> V,
    ) -> &mut V {
        if !self.slots.is_empty() {
            let (i, found) = self.find(key, hash);
            if found {
                return &mut self.slots[i].value;
            }
        }
        self.reserve_one(hash_of);
        let (i, _) = self.find(key, hash);
        self.slots[i] = Slot {
            key,
            used: true,
            value: make(),
        };
        self.len += 1;
        &mut self.slots[i].value
    }

    /// Empties slot `hole` and shifts back the slots after it that would otherwise no longer
    /// be found: each one whose home is not between the hole and itself.
    fn remove_at(&mut self, mut hole: usize, hash_of: &impl Fn(u64) -> u64) {
        let capacity = self.slots.len();
        self.slots[hole].used = false;
        self.len -= 1;
        let mut next = hole;
        loop {
            next += 1;
            if next == capacity {
                next = 0;
            }
            if !self.slots[next].used {
                return;
            }
            let home = Self::home(hash_of(self.slots[next].key), capacity);
            // Distances going forward, around the end: the slot stays if its home lies in
            // (hole, next].
            let from_home = (next + capacity - home) % capacity;
            let from_hole = (next + capacity - hole) % capacity;
            if from_home >= from_hole {
                self.slots[hole] = self.slots[next];
                self.slots[next].used = false;
                hole = next;
            }
        }
    }
}

impl<V: Copy + Default> Default for StateTable<V> {
    fn default() -> StateTable<V> {
        StateTable {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        slots: Vec::new(),
                        len: 0,
                    })
                })
                .collect(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }
}

impl<V: Copy + Default> StateTable<V> {
    fn hash(&self, key: u64) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of `hash`, locked. Nothing under the lock panics but a caller's closure; a
    /// shard it poisoned is still whole (each change to it is made in one step).
    fn shard(&self, hash: u64) -> MutexGuard<'_, Shard<V>> {
        self.shards[hash as usize % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on `key`'s value (the default if it had none), under its shard's lock.
    pub fn with<T>(&self, key: u64, f: impl FnOnce(&mut V) -> T) -> T {
        let hash = self.hash(key);
        let mut shard = self.shard(hash);
        f(shard.entry(key, hash, &|k| self.hash(k), V::default))
    }

    /// Gives `key` the value `make` makes, unless it has one.
    pub fn insert_if_absent(&self, key: u64, make: impl FnOnce() -> V) {
        let hash = self.hash(key);
        self.shard(hash).entry(key, hash, &|k| self.hash(k), make);
    }

    /// Sets `key`'s value.
    pub fn insert(&self, key: u64, value: V) {
        self.with(key, |v| *v = value);
    }

    /// A copy of `key`'s value, if it has one.
    pub fn get(&self, key: u64) -> Option<V> {
        let hash = self.hash(key);
        let shard = self.shard(hash);
        if shard.slots.is_empty() {
            return None;
        }
        let (i, found) = shard.find(key, hash);
        found.then(|| shard.slots[i].value)
    }

    /// Keeps only the keys for which `keep` says so, a shard at a time; `keep` may change the
    /// values it keeps. Each key is shown to `keep` once. A shard left at most a quarter full
    /// gives back most of its slots, so the memory of a burst of keys is freed once they are
    /// forgotten.
    pub fn retain(&self, mut keep: impl FnMut(u64, &mut V) -> bool) {
        let hash_of = |k| self.hash(k);
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            let capacity = shard.slots.len();
            // Start after an empty slot (a table is never full): a removal shifts back only
            // slots up to the next empty one, so none already seen moves ahead of the scan.
            let Some(start) = shard.slots.iter().position(|s| !s.used) else {
                continue;
            };
            let mut seen = 0;
            let mut i = start;
            while seen < capacity {
                i += 1;
                if i == capacity {
                    i = 0;
                }
                seen += 1;
                // A removal can shift the next slots into `i`: look at `i` until it holds
                // nothing new.
                while shard.slots[i].used {
                    let slot = &mut shard.slots[i];
                    if keep(slot.key, &mut slot.value) {
                        break;
                    }
                    shard.remove_at(i, &hash_of);
                }
            }
            shard.shrink_if_sparse(&hash_of);
        }
    }

    /// How many keys have a value.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len)
            .sum()
    }

    /// Whether no key has a value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every key, and the shards' memory.
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            shard.slots = Vec::new();
            shard.len = 0;
        }
    }
}

#[cfg(test)]
impl<V> StateTable<V> {
    /// Each shard's keys and slots.
    fn shape(&self) -> Vec<(usize, usize)> {
        self.shards
            .iter()
            .map(|s| {
                let shard = s.lock().unwrap_or_else(PoisonError::into_inner);
                (shard.len, shard.slots.len())
            })
            .collect()
    }

    /// The slots of every shard.
    fn slots(&self) -> usize {
        self.shape().iter().map(|&(_, slots)| slots).sum()
    }
}

impl<V> std::fmt::Debug for StateTable<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateTable")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Debug, Clone)]
    enum Op {
        Bump(u64),
        InsertIfAbsent(u64, u32),
        Insert(u64, u32),
        Get(u64),
        /// Drops the keys whose value is divisible by the divisor, and bumps the rest.
        Retain(u32),
        Clear,
    }

    fn op(keys: u64) -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (0..keys).prop_map(Op::Bump),
            2 => (0..keys, any::<u32>()).prop_map(|(k, v)| Op::InsertIfAbsent(k, v)),
            2 => (0..keys, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            4 => (0..keys).prop_map(Op::Get),
            2 => (1..4u32).prop_map(Op::Retain),
            1 => Just(Op::Clear),
        ]
    }

    /// Runs `ops` on a table and on a `HashMap`, which must agree throughout.
    fn agree(ops: &[Op], spread: u64) {
        let table = StateTable::<u32>::default();
        let mut model = HashMap::<u64, u32>::new();
        for op in ops {
            match *op {
                Op::Bump(k) => {
                    let k = k.wrapping_mul(spread);
                    let got = table.with(k, |v| {
                        *v = v.wrapping_add(1);
                        *v
                    });
                    let want = model.entry(k).or_default();
                    *want = want.wrapping_add(1);
                    assert_eq!(got, *want);
                }
                Op::InsertIfAbsent(k, v) => {
                    let k = k.wrapping_mul(spread);
                    table.insert_if_absent(k, || v);
                    model.entry(k).or_insert(v);
                }
                Op::Insert(k, v) => {
                    let k = k.wrapping_mul(spread);
                    table.insert(k, v);
                    model.insert(k, v);
                }
                Op::Get(k) => {
                    let k = k.wrapping_mul(spread);
                    assert_eq!(table.get(k), model.get(&k).copied());
                }
                Op::Retain(d) => {
                    let mut shown = HashMap::new();
                    table.retain(|k, v| {
                        *shown.entry(k).or_insert(0) += 1;
                        if *v % d == 0 {
                            return false;
                        }
                        *v = v.wrapping_add(1);
                        true
                    });
                    assert!(shown.values().all(|&n| n == 1), "a key shown twice");
                    assert_eq!(shown.len(), model.len(), "a key not shown");
                    for (len, slots) in table.shape() {
                        assert!(
                            if len == 0 {
                                slots == 0
                            } else {
                                slots <= FIRST_CAPACITY || len * 4 > slots
                            },
                            "a shard of {len} keys kept {slots} slots after a pass"
                        );
                    }
                    model.retain(|_, v| {
                        if *v % d == 0 {
                            return false;
                        }
                        *v = v.wrapping_add(1);
                        true
                    });
                }
                Op::Clear => {
                    table.clear();
                    model.clear();
                }
            }
            assert_eq!(table.len(), model.len());
        }
        for (k, v) in &model {
            assert_eq!(table.get(*k), Some(*v));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Few keys: small tables, where probes wrap around the end and removals shift
        /// clusters back across it.
        #[test]
        fn a_table_of_few_keys_agrees_with_a_hash_map(
            ops in proptest::collection::vec(op(40), 1..400)
        ) {
            agree(&ops, 1);
        }
    }

    proptest! {
        // Each case is slow in a debug build (every step counts all 256 shards).
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Many keys: every shard grows several times.
        #[test]
        fn a_table_of_many_keys_agrees_with_a_hash_map(
            ops in proptest::collection::vec(op(20_000), 1..3_000)
        ) {
            agree(&ops, 0x9e37_79b9_7f4a_7c15);
        }
    }

    #[test]
    fn a_slot_of_a_limiter_state_is_one_cache_line() {
        assert_eq!(
            std::mem::size_of::<Slot<crate::limits::KeyState>>(),
            64,
            "key, mark and state in 64 bytes"
        );
    }

    /// The slots of a burst of keys are given back once the keys are forgotten, and a shard
    /// shrunk still finds its keys and grows again.
    #[test]
    fn a_pass_that_forgets_most_keys_gives_back_their_slots() {
        let table = StateTable::<u32>::default();
        let key = |i: u64| i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for i in 0..100_000 {
            table.insert(key(i), i as u32);
        }
        let burst = table.slots();
        assert!(burst >= 100_000 * 8 / 7, "{burst} slots for 100,000 keys");

        table.retain(|_, v| *v % 100 == 0);
        assert_eq!(table.len(), 1_000);
        let kept = table.slots();
        assert!(kept <= burst / 20, "{kept} slots kept of {burst}");
        for i in 0..100_000 {
            assert_eq!(table.get(key(i)), (i % 100 == 0).then_some(i as u32));
        }

        for i in 0..100_000 {
            table.insert_if_absent(key(i), || i as u32);
        }
        assert_eq!(table.len(), 100_000);
        assert_eq!(table.get(key(4_321)), Some(4_321));

        table.retain(|_, _| false);
        assert_eq!(table.slots(), 0);
        assert!(table.is_empty());
    }

    /// Removals in a full-ish table keep every other key findable, clusters around the end of
    /// the slots included: one shard's worth of keys, removed one by one.
    #[test]
    fn removing_keys_one_by_one_leaves_the_others_findable() {
        let table = StateTable::<u32>::default();
        let keys: Vec<u64> = (0..5_000u64).map(|k| k.wrapping_mul(0x9e37_79b9)).collect();
        for (i, &k) in keys.iter().enumerate() {
            table.insert(k, i as u32);
        }
        for (n, &gone) in keys.iter().enumerate() {
            table.retain(|k, _| k != gone);
            assert_eq!(table.get(gone), None);
            assert_eq!(table.len(), keys.len() - n - 1);
            for (i, &k) in keys.iter().enumerate().skip(n + 1).step_by(97) {
                assert_eq!(
                    table.get(k),
                    Some(i as u32),
                    "key {k} lost after {n} removals"
                );
            }
        }
        assert!(table.is_empty());
    }
}
