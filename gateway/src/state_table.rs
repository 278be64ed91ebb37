//! The limiter's map from key ids to their state: shards of open-addressed tables whose slots
//! are one cache line each, the key beside its value.
//!
//! A decision among a million keys reads its key's slot from memory, and that read is most of its
//! time (`bench/results.md`: a decision costs about 0.7 of one load from memory). A SwissTable,
//! such as `DashMap`'s, keeps a key's control byte apart from its entry, so a lookup reads two
//! places, the second found only by the first. Here a lookup reads the slot its hash points to,
//! and, only if another key holds that slot, the next ones (linear probing). With a key, its mark
//! and its state (57 bytes) in a 64-byte slot, a table that is at most 7/8 full and grows by half
//! takes 73 to 110 bytes a key, and up to 118 where a pass grew a shard early (below)
//! (`DashMap`'s entries with their control bytes took 120-125 at a million keys; `cargo bench`
//! measures 80-84 here).
//!
//! Each shard is a table under its own mutex, so decisions of different shards never wait for
//! each other. A shard's slots are one array, which from 2 MiB on is in transparent huge pages
//! (`slot_memory.rs`): a million keys fill 32 shards' arrays of about 2.4 MiB each, and a
//! decision among them no longer waits for a page walk as well as for its slot. A pass over every
//! key ([`StateTable::retain`]) holds a shard for at most `WINDOW` slots at a time, so however
//! large a shard is, a decision waits for a pass only briefly. A shard that grows or shrinks
//! makes its new slots with the lock let go, and holds it only while its keys move in. A pass
//! grows a shard it finds nearly full, so that keys arriving at an everyday pace never make a
//! decision wait for its shard's new slots: only a burst of them within one pass does. Removal
//! shifts the slots after it back (no tombstones), so a table that forgets idle keys stays as
//! fast to search as a fresh one.

use parking_lot::{Mutex, MutexGuard};
use std::hash::BuildHasher;

use crate::slot_memory::SlotMemory;

/// Number of shards: a power of two, taken from the low bits of a key's hash. Few enough that
/// a shard of a million keys' table is more than one huge page, enough that worker threads
/// seldom want the same shard at once.
const SHARDS: usize = 32;

/// The slots a pass looks at with its shard locked before it lets decisions in (a few µs).
/// The unit tests take a few, so that their small tables are passed over in many windows too.
const WINDOW: usize = if cfg!(test) { 5 } else { 512 };

/// An empty slot's mark; a used slot is marked [`MARKS`]`.0` or `.1`, whichever its shard's last
/// pass left on the keys it showed.
const EMPTY: u8 = 0;

/// The two marks of used slots.
const MARKS: (u8, u8) = (1, 2);

/// A shard's slots when it is first used.
const FIRST_CAPACITY: usize = 8;

/// A table of `V` by 64-bit key, in `SHARDS` shards.
pub struct StateTable<V> {
    shards: Box<[Mutex<Shard<V>>]>,
    /// Held by a pass ([`StateTable::retain`]) from start to end.
    passing: Mutex<()>,
    /// Random for each table: the keys are random ids already, and this keeps them so.
    hasher: foldhash::fast::RandomState,
}

/// One key's slot: a cache line when `V` is at most 48 bytes.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Slot<V> {
    key: u64,
    /// [`EMPTY`], or the mark of a used slot: a pass shows the keys whose mark is not yet its
    /// own, so a key moved while the pass let go of the shard is still shown once.
    mark: u8,
    value: V,
}

struct Shard<V> {
    slots: SlotMemory<Slot<V>>,
    len: usize,
    /// The mark new keys get: that of the shard's latest pass, so that a pass still going
    /// shows the keys it found, not those added since (their state is new, and the next pass
    /// shows it).
    mark: u8,
    /// Times the slots were replaced, for a pass to see that the slots it was looking at moved.
    rebuilds: u64,
}

impl<V: Copy + Default> Shard<V> {
    fn empty_slots(capacity: usize) -> SlotMemory<Slot<V>> {
        SlotMemory::new(
            capacity,
            Slot {
                key: 0,
                mark: EMPTY,
                value: V::default(),
            },
        )
    }

    /// Where a key with hash `hash` belongs in `capacity` slots: the hash's high bits scaled to
    /// the capacity, which need not be a power of two.
    fn home(hash: u64, capacity: usize) -> usize {
        ((u128::from(hash) * capacity as u128) >> 64) as usize
    }

    /// The index of `key`'s slot, if it has one.
    fn position(&self, key: u64, hash: u64) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let (i, found) = self.find(key, hash);
        found.then_some(i)
    }

    /// The index of `key`'s slot, or of the empty slot where it would go; there must be one.
    fn find(&self, key: u64, hash: u64) -> (usize, bool) {
        let capacity = self.slots.len();
        let home = Self::home(hash, capacity);
        let mut i = home;
        loop {
            let slot = &self.slots[i];
            if slot.mark == EMPTY {
                return (i, false);
            }
            if slot.key == key {
                return (i, true);
            }
            i += 1;
            if i == capacity {
                i = 0;
            }
            // A full table would be searched forever: in tests, a failure instead.
            debug_assert_ne!(i, home, "no empty slot in {capacity}");
        }
    }

    /// The slots the shard grows to: half as many again as it has (the first time,
    /// [`FIRST_CAPACITY`]).
    fn grown(&self) -> usize {
        let capacity = self.slots.len();
        (capacity + capacity / 2).max(FIRST_CAPACITY)
    }

    /// The slots the shard must grow to before it takes one more key, if it must: it is at
    /// most 7/8 full.
    fn growth(&self) -> Option<usize> {
        ((self.len + 1) * 8 > self.slots.len() * 7).then(|| self.grown())
    }

    /// The slots a pass grows a nearly full shard to, if it should: one more than 13/16 full
    /// grows now, as its next keys would soon make it grow in a decision, whose request would
    /// then wait for the new slots to be made (milliseconds for an array in huge pages). Grown
    /// from 13/16, it is at least 13/24 full after: at most 118 bytes a key.
    fn early_growth(&self) -> Option<usize> {
        (self.len * 16 > self.slots.len() * 13).then(|| self.grown())
    }

    /// The slots a shard that forgot most of its keys shrinks to, if it should: one at most a
    /// quarter full is rebuilt half full, so it neither shrinks again nor grows soon after; one
    /// left empty keeps no slots (`Some(0)`).
    fn shrinking(&self) -> Option<usize> {
        let capacity = self.slots.len();
        if self.len == 0 {
            (capacity > 0).then_some(0)
        } else {
            (capacity > FIRST_CAPACITY && self.len * 4 <= capacity)
                .then(|| (self.len * 2).max(FIRST_CAPACITY))
        }
    }

    /// Puts `slots` in place of the shard's, counted in [`Shard::rebuilds`], and hands back the
    /// old ones.
    fn replace_slots(&mut self, slots: SlotMemory<Slot<V>>) -> SlotMemory<Slot<V>> {
        self.rebuilds += 1;
        std::mem::replace(&mut self.slots, slots)
    }

    /// Moves every key into `slots`, empty and more than the keys, and hands back the old ones.
    fn rebuild_into(
        &mut self,
        slots: SlotMemory<Slot<V>>,
        hash_of: &impl Fn(u64) -> u64,
    ) -> SlotMemory<Slot<V>> {
        let old = self.replace_slots(slots);
        for slot in old.iter().filter(|s| s.mark != EMPTY) {
            let (i, _) = self.find(slot.key, hash_of(slot.key));
            self.slots[i] = *slot;
        }
        old
    }

    /// `key`'s value, made by `make` if it has none; the shard must have room for one more key
    /// ([`StateTable::make_room`]).
    fn entry(&mut self, key: u64, hash: u64, make: impl FnOnce() -> V) -> &mut V {
        if let Some(i) = self.position(key, hash) {
            return &mut self.slots[i].value;
        }
        debug_assert!(self.growth().is_none(), "no room made for a new key");
        let (i, _) = self.find(key, hash);
        self.slots[i] = Slot {
            key,
            mark: self.mark,
            value: make(),
        };
        self.len += 1;
        &mut self.slots[i].value
    }

    /// Empties slot `hole` and shifts back the slots after it that would otherwise no longer
    /// be found: each one whose home is not between the hole and itself.
    fn remove_at(&mut self, mut hole: usize, hash_of: &impl Fn(u64) -> u64) {
        let capacity = self.slots.len();
        self.slots[hole].mark = EMPTY;
        self.len -= 1;
        let mut next = hole;
        loop {
            next += 1;
            if next == capacity {
                next = 0;
            }
            if self.slots[next].mark == EMPTY {
                return;
            }
            let home = Self::home(hash_of(self.slots[next].key), capacity);
            // Distances going forward, around the end: the slot stays if its home lies in
            // (hole, next].
            let from_home = (next + capacity - home) % capacity;
            let from_hole = (next + capacity - hole) % capacity;
            if from_home >= from_hole {
                self.slots[hole] = self.slots[next];
                self.slots[next].mark = EMPTY;
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
                        slots: SlotMemory::default(),
                        len: 0,
                        mark: MARKS.0,
                        rebuilds: 0,
                    })
                })
                .collect(),
            passing: Mutex::new(()),
            hasher: foldhash::fast::RandomState::default(),
        }
    }
}

impl<V: Copy + Default> StateTable<V> {
    fn hash(&self, key: u64) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of `hash`, locked. Nothing under the lock panics but a caller's closure, and a
    /// shard it left is still whole (each change to it is made in one step); the lock is not
    /// poisoned.
    fn shard(&self, hash: u64) -> MutexGuard<'_, Shard<V>> {
        self.shards[hash as usize % SHARDS].lock()
    }

    /// Runs `f` on `key`'s value (the default if it had none), under its shard's lock.
    pub fn with<T>(&self, key: u64, f: impl FnOnce(&mut V) -> T) -> T {
        self.with_and_between(key, f, || {})
    }

    /// [`StateTable::with`], calling `between` each time a growth of the shard has let go of it.
    fn with_and_between<T>(
        &self,
        key: u64,
        f: impl FnOnce(&mut V) -> T,
        between: impl FnMut(),
    ) -> T {
        let hash = self.hash(key);
        let mut shard = self.shard(hash);
        if let Some(i) = shard.position(key, hash) {
            return f(&mut shard.slots[i].value);
        }
        let freed = self.make_room(&mut shard, key, hash, between);
        let made = f(shard.entry(key, hash, V::default));
        drop(shard);
        drop(freed);
        made
    }

    /// Gives `key` the value `make` makes, unless it has one.
    pub fn insert_if_absent(&self, key: u64, make: impl FnOnce() -> V) {
        let hash = self.hash(key);
        let mut shard = self.shard(hash);
        if shard.position(key, hash).is_some() {
            return;
        }
        let freed = self.make_room(&mut shard, key, hash, || {});
        shard.entry(key, hash, make);
        drop(shard);
        drop(freed);
    }

    /// Room in `shard` for `key`, which it did not have when looked up. A shard that must grow
    /// to take it gets its new slots made with the lock let go: making them touches every page,
    /// which for an array in huge pages may take the kernel milliseconds (zeroing, and
    /// compacting memory to find the pages; `cargo bench` prints these growths), and decisions
    /// of the shard's other keys need not wait for that. They wait only while the keys move in.
    /// Hands back the slots no longer used (the old ones, or new ones made in vain because the
    /// shard changed meanwhile), to be given back once the lock is let go too. `between` runs
    /// while the lock is let go.
    #[cold]
    fn make_room(
        &self,
        shard: &mut MutexGuard<'_, Shard<V>>,
        key: u64,
        hash: u64,
        mut between: impl FnMut(),
    ) -> Vec<SlotMemory<Slot<V>>> {
        let mut freed = Vec::new();
        while let Some(capacity) = shard.growth() {
            let (slots, unchanged) = Self::slots_made_unlocked(shard, capacity, &mut between);
            // The same slots as before, so at most 7/8 full: the new ones have room for them all.
            freed.push(if unchanged {
                shard.rebuild_into(slots, &|k| self.hash(k))
            } else {
                slots
            });
            // Another decision may have given `key` its value meanwhile.
            if shard.position(key, hash).is_some() {
                break;
            }
        }
        freed
    }

    /// `capacity` new slots for the shard of `guard`, made with its lock let go (fairly: a
    /// decision waiting for it goes first), and whether the shard still has the slots it had
    /// then, which another thread may have replaced meanwhile. `between` runs while it is let go.
    fn slots_made_unlocked(
        guard: &mut MutexGuard<'_, Shard<V>>,
        capacity: usize,
        between: impl FnOnce(),
    ) -> (SlotMemory<Slot<V>>, bool) {
        let rebuilds = guard.rebuilds;
        let slots = MutexGuard::unlocked_fair(guard, || {
            let slots = Shard::empty_slots(capacity);
            between();
            slots
        });
        (slots, guard.rebuilds == rebuilds)
    }

    /// Sets `key`'s value.
    pub fn insert(&self, key: u64, value: V) {
        self.with(key, |v| *v = value);
    }

    /// A copy of `key`'s value, if it has one.
    pub fn get(&self, key: u64) -> Option<V> {
        let hash = self.hash(key);
        let shard = self.shard(hash);
        shard.position(key, hash).map(|i| shard.slots[i].value)
    }

    /// Keeps only the keys for which `keep` says so, a shard at a time; `keep` may change the
    /// values it keeps. Each key that had a value when the pass came to its shard is shown to
    /// `keep` once; one given a value since may or may not be. A shard left at most a quarter
    /// full gives back most of its slots, so the memory of a burst of keys is freed once they
    /// are forgotten; one left more than 13/16 full grows by half, ahead of its next keys.
    /// Passes take turns.
    pub fn retain(&self, keep: impl FnMut(u64, &mut V) -> bool) {
        self.retain_and_between(keep, || {});
    }

    /// [`StateTable::retain`], calling `between` each time the pass has let go of its shard.
    fn retain_and_between(
        &self,
        mut keep: impl FnMut(u64, &mut V) -> bool,
        mut between: impl FnMut(),
    ) {
        let _turn = self.passing.lock();
        let hash_of = |k| self.hash(k);
        for shard in self.shards.iter() {
            let mut guard = shard.lock();
            // Keys not shown yet keep the other mark, whatever moves them.
            let shown = if guard.mark == MARKS.0 {
                MARKS.1
            } else {
                MARKS.0
            };
            guard.mark = shown;
            let mut rebuilds = guard.rebuilds;
            let mut i = 0;
            loop {
                let end = (i + WINDOW).min(guard.slots.len());
                while i < end {
                    // A removal shifts the slots after `i` back into it: look at `i` until it
                    // holds no key to show. Slots shifted back from before `i` (around the end)
                    // hold keys shown already.
                    while guard.slots[i].mark != EMPTY && guard.slots[i].mark != shown {
                        let slot = &mut guard.slots[i];
                        if keep(slot.key, &mut slot.value) {
                            slot.mark = shown;
                            break;
                        }
                        guard.remove_at(i, &hash_of);
                    }
                    i += 1;
                }
                if i >= guard.slots.len() {
                    break;
                }
                // Let waiting decisions in, first (a fair unlock: one that only let go of the
                // lock would take it back before a waiting thread woke). Keys they add are
                // marked shown; if the slots were replaced meanwhile, look at them all again
                // for keys not shown.
                MutexGuard::unlocked_fair(&mut guard, &mut between);
                if guard.rebuilds != rebuilds {
                    rebuilds = guard.rebuilds;
                    i = 0;
                }
            }
            // A shard that forgot most of its keys shrinks; one nearly full grows now, on the
            // pass's thread, rather than in the decision of a request that brings a new key. As
            // a growth does (`make_room`): the new slots are made with the lock let go. Keys may
            // come meanwhile: the new slots are used only if they still hold them at most 7/8
            // full.
            if let Some(capacity) = guard.shrinking().or_else(|| guard.early_growth()) {
                let (slots, unchanged) =
                    Self::slots_made_unlocked(&mut guard, capacity, &mut between);
                let freed = if !unchanged || guard.len * 8 > capacity * 7 {
                    slots
                } else if capacity == 0 {
                    guard.replace_slots(slots)
                } else {
                    guard.rebuild_into(slots, &hash_of)
                };
                drop(guard);
                drop(freed);
            }
        }
    }

    /// How many keys have a value.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len).sum()
    }

    /// Whether no key has a value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes the table holds: every shard's slots (used or not), and the shards
    /// themselves. What the allocator keeps beside them, such as arrays freed as shards grew,
    /// is not counted: this is the table's memory whichever allocator serves it.
    pub fn bytes(&self) -> usize {
        let slots: usize = self.shards.iter().map(|s| s.lock().slots.bytes()).sum();
        slots + size_of_val::<[Mutex<Shard<V>>]>(&self.shards) + size_of::<Self>()
    }

    /// Forgets every key, and the shards' memory.
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            shard.replace_slots(SlotMemory::default());
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
                let shard = s.lock();
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
        // Each case is slow in a debug build (every step counts all the shards).
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

    /// The table's bytes are its slots' and little more: 73 to 118 bytes a limiter state,
    /// however many keys, and nearly nothing once they are forgotten.
    #[test]
    fn a_table_counts_its_bytes_as_its_slots() {
        let table = StateTable::<crate::limits::KeyState>::default();
        let empty = table.bytes();
        assert!(empty < 4096, "{empty} bytes with no key");
        let key = |i: u64| i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut n = 0;
        for keys in [1_000, 30_000, 200_000] {
            while n < keys {
                table.insert(key(n), Default::default());
                n += 1;
            }
            assert_eq!(table.bytes(), empty + table.slots() * 64);
            let per_key = (table.bytes() - empty) as f64 / keys as f64;
            assert!(
                (73.0..=118.0).contains(&per_key),
                "{per_key} bytes a key at {keys}"
            );
        }
        table.retain(|_, _| false);
        assert_eq!(table.bytes(), empty);
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

    /// A pass shows each key it found once, and loses none, when keys are added to the shard
    /// it is in while it has let go of it: enough to make the shard grow (its slots replaced)
    /// at one of several points of the pass, or fewer, and with others changed.
    #[test]
    fn a_pass_shows_each_key_once_while_keys_are_added_and_its_shard_grows() {
        for (window, adds) in [(0, 30), (1, 30), (40, 30), (150, 30), (190, 30), (40, 5)] {
            let table = StateTable::<u32>::default();
            // Keys of the first shard, the one a pass starts with.
            let keys: Vec<u64> = (0..)
                .map(|k: u64| k.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .filter(|&k| (table.hash(k) as usize).is_multiple_of(SHARDS))
                .take(1_000)
                .collect();
            // 880 keys in 1,021 slots: the shard grows on the 14th key added.
            let before = 880;
            for &k in &keys[..before] {
                table.insert(k, 1);
            }
            let forgets = |k: u64| k.is_multiple_of(3);
            let mut shown = HashMap::<u64, u32>::new();
            let (mut windows, mut added) = (0, before);
            table.retain_and_between(
                |k, v| {
                    *shown.entry(k).or_insert(0) += 1;
                    *v |= 4;
                    !forgets(k)
                },
                || {
                    if windows == window {
                        for &k in &keys[added..added + adds] {
                            table.insert(k, 7);
                            // A key the pass keeps (`with` gives a forgotten one back).
                            if let Some(&kept) = keys.iter().find(|&&o| !forgets(o)) {
                                table.with(kept, |v| *v |= 2);
                            }
                        }
                        added += adds;
                    }
                    windows += 1;
                },
            );
            assert_eq!(added, before + adds, "keys added after window {window}");
            assert!(shown.values().all(|&n| n == 1), "a key shown twice");
            for (n, &k) in keys[..added].iter().enumerate() {
                if n < before {
                    assert_eq!(shown.get(&k), Some(&1), "key {n} not shown");
                }
                let kept = !forgets(k) || !shown.contains_key(&k);
                assert_eq!(table.get(k).is_some(), kept, "key {n}");
            }
            let held = keys[..added]
                .iter()
                .filter(|&&k| table.get(k).is_some())
                .count();
            assert_eq!(table.len(), held);
        }
    }

    /// Keys of the first shard: those a pass looks at first.
    fn first_shard_keys(table: &StateTable<u32>, n: usize) -> Vec<u64> {
        (0..)
            .map(|k: u64| k.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .filter(|&k| (table.hash(k) as usize).is_multiple_of(SHARDS))
            .take(n)
            .collect()
    }

    /// A shard that grows lets go of its lock while its new slots are made, so decisions of its
    /// other keys go on meanwhile; and what they do meanwhile is kept: keys added, even enough
    /// to make the shard grow first, which leaves the slots made in vain.
    #[test]
    fn a_growing_shard_lets_others_in_while_its_new_slots_are_made() {
        for adds in [0, 1, 200] {
            let table = StateTable::<u32>::default();
            let keys = first_shard_keys(&table, 1_000);
            // The shard is full when a new key would make it more than 7/8 full.
            let mut added = 0;
            loop {
                table.insert(keys[added], 1);
                added += 1;
                if added > FIRST_CAPACITY && table.shards[0].lock().growth().is_some() {
                    break;
                }
            }
            let (full, slots) = (added, table.shape()[0].1);
            let mut growths_between = 0;
            let value = table.with_and_between(
                keys[full],
                |v| {
                    *v += 5;
                    *v
                },
                || {
                    growths_between += 1;
                    let shard = table.shards[0].try_lock();
                    assert!(shard.is_some(), "the shard locked while its slots are made");
                    drop(shard);
                    // Another decision of the shard meanwhile, and keys added.
                    table.with(keys[0], |v| *v += 1);
                    for &k in &keys[full + 1..full + 1 + adds] {
                        table.insert(k, 3);
                    }
                },
            );
            assert_eq!(value, 5);
            assert!(growths_between >= 1);
            let (len, grown) = table.shape()[0];
            assert_eq!(len, full + 1 + adds);
            assert!(
                grown > slots && len * 8 <= grown * 7,
                "{len} keys in {grown} slots"
            );
            assert_eq!(table.get(keys[0]), Some(2));
            for &k in &keys[1..full] {
                assert_eq!(table.get(k), Some(1));
            }
            assert_eq!(table.get(keys[full]), Some(5));
            for &k in &keys[full + 1..full + 1 + adds] {
                assert_eq!(table.get(k), Some(3));
            }
        }
    }

    /// A pass grows a shard that it finds more than 13/16 full, with its lock let go while the
    /// new slots are made and the keys added meanwhile kept, so that the decisions that bring
    /// the shard's next keys make no slots; if keys enough for a decision to grow the shard came
    /// meanwhile (here twice), the pass's slots are not used. A shard less full keeps its slots.
    #[test]
    fn a_pass_grows_a_nearly_full_shard_ahead_of_its_next_keys() {
        for (fill_to_13_16, adds) in [(true, 0), (true, 3), (true, 400), (false, 0)] {
            let table = StateTable::<u32>::default();
            let keys = first_shard_keys(&table, 2_000);
            // Grown as decisions grow it, to the first size that holds 400 keys.
            for &k in &keys[..400] {
                table.insert(k, 1);
            }
            let mut added = 400;
            while fill_to_13_16 && table.shards[0].lock().early_growth().is_none() {
                table.insert(keys[added], 1);
                added += 1;
            }
            let slots = table.shape()[0].1;
            assert!(
                table.shards[0].lock().growth().is_none(),
                "the shard grew in a decision"
            );
            let windows = (slots - 1) / WINDOW;
            let mut lets_go = 0;
            table.retain_and_between(
                |_, _| true,
                || {
                    lets_go += 1;
                    if lets_go == windows + 1 {
                        let shard = table.shards[0].try_lock();
                        assert!(shard.is_some(), "the shard locked while its slots are made");
                        drop(shard);
                        for &k in &keys[added..added + adds] {
                            table.insert(k, 9);
                        }
                    }
                },
            );
            let (len, grown) = table.shape()[0];
            assert_eq!(len, added + adds);
            if !fill_to_13_16 {
                assert_eq!(
                    (lets_go, grown),
                    (windows, slots),
                    "a shard not nearly full grew"
                );
                continue;
            }
            assert_eq!(lets_go, windows + 1);
            assert!(
                grown >= slots + slots / 2 && len * 8 <= grown * 7,
                "{len} keys in {grown} slots"
            );
            if adds < 10 {
                assert_eq!(grown, slots + slots / 2, "{len} keys in {slots} slots");
            }
            for &k in &keys[..added] {
                assert_eq!(table.get(k), Some(1));
            }
            for &k in &keys[added..added + adds] {
                assert_eq!(table.get(k), Some(9));
            }
            // Room for the next keys up to 7/8 of the new slots: none of their decisions grows
            // the shard.
            let room = grown * 7 / 8 - len;
            for &k in &keys[added + adds..added + adds + room] {
                table.with_and_between(k, |v| *v = 2, || panic!("a decision grew the shard"));
            }
            assert_eq!(table.shape()[0], (len + room, grown));
        }
    }

    /// A pass shrinks a shard that forgot most of its keys with its lock let go while the new
    /// slots are made; keys added meanwhile are kept, and if too many came for the smaller
    /// slots, the shard keeps its own.
    #[test]
    fn a_shrinking_shard_keeps_the_keys_added_while_its_new_slots_are_made() {
        for (adds, shrinks) in [(10, true), (600, false)] {
            let table = StateTable::<u32>::default();
            let keys = first_shard_keys(&table, 2_000);
            for &k in &keys[..1_000] {
                table.insert(k, 1);
            }
            let slots = table.shape()[0].1;
            // The pass lets go after each window of the shard but its last, and then once more
            // while the shard's smaller slots are made (the other shards have none).
            let windows = (slots - 1) / WINDOW;
            let mut lets_go = 0;
            table.retain_and_between(
                |k, _| keys[..100].contains(&k),
                || {
                    lets_go += 1;
                    if lets_go == windows + 1 {
                        let shard = table.shards[0].try_lock();
                        let shard = shard.expect("the shard locked while its slots are made");
                        assert_eq!(shard.len, 100, "the shard passed over");
                        drop(shard);
                        for &k in &keys[1_000..1_000 + adds] {
                            table.insert(k, 9);
                        }
                    }
                },
            );
            assert_eq!(lets_go, windows + 1);
            let (len, kept) = table.shape()[0];
            assert_eq!(len, 100 + adds);
            assert_eq!(
                kept < slots,
                shrinks,
                "{kept} slots of {slots}, {adds} keys added"
            );
            for &k in &keys[..100] {
                assert_eq!(table.get(k), Some(1));
            }
            for &k in &keys[100..1_000] {
                assert_eq!(table.get(k), None);
            }
            for &k in &keys[1_000..1_000 + adds] {
                assert_eq!(table.get(k), Some(9));
            }
        }
    }
}
