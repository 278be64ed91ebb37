//! One shard of the [`StateTable`](super::StateTable): an open-addressed table of one-cache-line
//! slots, searched by linear probing from the slot a key's hash points to, and emptied by shifting
//! back the slots after a removed one (no tombstones). The table's module says why this layout;
//! this one holds its slots and how they are searched, grown, shrunk and rebuilt.

use crate::slot_memory::SlotMemory;

/// An empty slot's mark; a used slot is marked [`MARKS`](super::MARKS)`.0` or `.1`, whichever
/// its shard's last pass left on the keys it showed.
pub(super) const EMPTY: u8 = 0;

/// A shard's slots when it is first used.
pub(super) const FIRST_CAPACITY: usize = 8;

/// One key's slot: a cache line when `V` is at most 48 bytes.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct Slot<V> {
    pub(super) key: u64,
    /// [`EMPTY`], or the mark of a used slot: a pass shows the keys whose mark is not yet its
    /// own, so a key moved while the pass let go of the shard is still shown once.
    pub(super) mark: u8,
    pub(super) value: V,
}

pub(super) struct Shard<V> {
    pub(super) slots: SlotMemory<Slot<V>>,
    pub(super) len: usize,
    /// The mark new keys get: that of the shard's latest pass, so that a pass still going
    /// shows the keys it found, not those added since (their state is new, and the next pass
    /// shows it).
    pub(super) mark: u8,
    /// Times the slots were replaced, for a pass to see that the slots it was looking at moved.
    pub(super) rebuilds: u64,
}

impl<V: Copy + Default> Shard<V> {
    pub(super) fn empty_slots(capacity: usize) -> SlotMemory<Slot<V>> {
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
    pub(super) fn home(hash: u64, capacity: usize) -> usize {
        ((u128::from(hash) * capacity as u128) >> 64) as usize
    }

    /// The index of `key`'s slot, if it has one.
    pub(super) fn position(&self, key: u64, hash: u64) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let (i, found) = self.find(key, hash);
        found.then_some(i)
    }

    /// The index of `key`'s slot, or of the empty slot where it would go; there must be one.
    pub(super) fn find(&self, key: u64, hash: u64) -> (usize, bool) {
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
    pub(super) fn grown(&self) -> usize {
        let capacity = self.slots.len();
        (capacity + capacity / 2).max(FIRST_CAPACITY)
    }

    /// The slots the shard must grow to before it takes one more key, if it must: it is at
    /// most 7/8 full.
    pub(super) fn growth(&self) -> Option<usize> {
        ((self.len + 1) * 8 > self.slots.len() * 7).then(|| self.grown())
    }

    /// The slots a pass grows a nearly full shard to, if it should: one more than 13/16 full
    /// grows now, as its next keys would soon make it grow in a decision, whose request would
    /// then wait for the new slots to be made (milliseconds for an array in huge pages). Grown
    /// from 13/16, it is at least 13/24 full after: at most 118 bytes a key.
    pub(super) fn early_growth(&self) -> Option<usize> {
        (self.len * 16 > self.slots.len() * 13).then(|| self.grown())
    }

    /// The slots a shard that forgot most of its keys shrinks to, if it should: one at most a
    /// quarter full is rebuilt half full, so it neither shrinks again nor grows soon after; one
    /// left empty keeps no slots (`Some(0)`).
    pub(super) fn shrinking(&self) -> Option<usize> {
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
    pub(super) fn replace_slots(&mut self, slots: SlotMemory<Slot<V>>) -> SlotMemory<Slot<V>> {
        self.rebuilds += 1;
        std::mem::replace(&mut self.slots, slots)
    }

    /// Moves every key into `slots`, empty and more than the keys, and hands back the old ones.
    pub(super) fn rebuild_into(
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
    /// ([`StateTable::make_room`](super::StateTable::make_room)).
    pub(super) fn entry(&mut self, key: u64, hash: u64, make: impl FnOnce() -> V) -> &mut V {
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
    pub(super) fn remove_at(&mut self, mut hole: usize, hash_of: &impl Fn(u64) -> u64) {
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
