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

mod shard;

use shard::{EMPTY, Shard, Slot};

/// Number of shards: a power of two, taken from the low bits of a key's hash. Few enough that
/// a shard of a million keys' table is more than one huge page, enough that worker threads
/// seldom want the same shard at once.
const SHARDS: usize = 32;

/// The slots a pass looks at with its shard locked before it lets decisions in (a few µs).
/// The unit tests take a few, so that their small tables are passed over in many windows too.
const WINDOW: usize = if cfg!(test) { 5 } else { 512 };

/// The two marks of used slots.
const MARKS: (u8, u8) = (1, 2);

/// A table of `V` by 64-bit key, in `SHARDS` shards.
pub struct StateTable<V> {
    shards: Box<[Mutex<Shard<V>>]>,
    /// Held by a pass ([`StateTable::retain`]) from start to end.
    passing: Mutex<()>,
    /// Random for each table: the keys are random ids already, and this keeps them so.
    hasher: foldhash::fast::RandomState,
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
