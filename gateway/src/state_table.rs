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

impl<V> std::fmt::Debug for StateTable<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateTable")
    }
}

#[cfg(test)]
mod tests;
