//! The index of usable keys by id ([`crate::key_set::KeySet`]): one slot per key in an open-addressed
//! table, so that a lookup among many keys reads one line of the index from memory, not a map's
//! control bytes and then its bucket, and reads it while the presented key's SHA-256 is computed.
//!
//! A table is built once from the key records and never changed: a new set of keys is a new
//! table ([`crate::keyring`]). It is at most half full, so every probe ends at an empty slot
//! within a few steps. Ids are hashed with a random state before they pick a slot, so ids that
//! are not random (an import's, a test's) spread as random ones do, and a presented id, which a
//! client chooses, only chooses where a probe starts among the table's own short runs.
#![allow(unsafe_code)]

use std::hash::BuildHasher;

use crate::keys::KeyId;

// A slot of the gateway's index, an id and an `Arc` (whose pointer is never null, so `None` takes
// no room of its own), is 16 bytes: four to a cache line.
const _: () = assert!(size_of::<Option<(KeyId, std::sync::Arc<()>)>>() == 16);

/// A table of `V` by [`KeyId`], built once.
pub struct KeyIndex<V> {
    /// A power of two in length, at most half used.
    slots: Box<[Option<(KeyId, V)>]>,
    len: usize,
    hasher: foldhash::fast::RandomState,
}

impl<V> KeyIndex<V> {
    /// The index of `entries`; of two with one id, the later is kept (as a map's `insert` does).
    pub fn build(entries: Vec<(KeyId, V)>) -> KeyIndex<V> {
        let capacity = (entries.len().max(1) * 2).next_power_of_two();
        let mut index = KeyIndex {
            slots: std::iter::repeat_with(|| None).take(capacity).collect(),
            len: 0,
            hasher: foldhash::fast::RandomState::default(),
        };
        for (id, value) in entries {
            let i = index.probe(index.home(id), id);
            let slot = &mut index.slots[i];
            if slot.is_none() {
                index.len += 1;
            }
            *slot = Some((id, value));
        }
        index
    }

    /// The value of `id`, if any.
    pub fn get(&self, id: KeyId) -> Option<&V> {
        self.get_meanwhile(id, || ()).0
    }

    /// The value of `id`, with what `meanwhile` returns: `meanwhile` runs after the slot where
    /// `id`'s probe starts has been asked of memory and before it is read, so that a cache miss
    /// there costs only what `meanwhile` leaves of it.
    pub fn get_meanwhile<T>(&self, id: KeyId, meanwhile: impl FnOnce() -> T) -> (Option<&V>, T) {
        let home = self.home(id);
        prefetch(&self.slots[home]);
        let made = meanwhile();
        let found = self.slots[self.probe(home, id)].as_ref().map(|(_, v)| v);
        (found, made)
    }

    /// Every value, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.slots.iter().flatten().map(|(_, v)| v)
    }

    /// How many ids the index holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the index holds no id.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where `id`'s probe starts: its hash's high bits, as many as the length has.
    fn home(&self, id: KeyId) -> usize {
        let bits = self.slots.len().trailing_zeros();
        let hash = self.hasher.hash_one(id.0);
        // The length is at least 2, so the shift is at most 63.
        (hash >> (64 - bits)) as usize
    }

    /// The slot holding `id`, or the empty slot that ends its probe from `home`; the table is at
    /// most half full, so there is one.
    fn probe(&self, home: usize, id: KeyId) -> usize {
        let mask = self.slots.len() - 1;
        let mut i = home;
        loop {
            match &self.slots[i] {
                Some((held, _)) if *held != id => i = (i + 1) & mask,
                _ => return i,
            }
        }
    }
}

impl<V> Default for KeyIndex<V> {
    fn default() -> KeyIndex<V> {
        KeyIndex::build(Vec::new())
    }
}

impl<V> std::fmt::Debug for KeyIndex<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyIndex")
            .field("len", &self.len)
            .field("slots", &self.slots.len())
            .finish()
    }
}

/// Asks for the cache line of `value` to be loaded, without waiting for it.
fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it reads nothing into the program and never faults, and the
    // address is that of a live reference besides.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(value).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// The index agrees with a hash map built from the same entries: on ids it holds, on ids
        /// it does not (near and far), and on its length and values. Ids from a small range
        /// collide often; sequential ids are what hashing must spread.
        #[test]
        fn an_index_agrees_with_a_hash_map(
            ids in prop_oneof![
                prop::collection::vec(0u64..64, 0..100),
                prop::collection::vec(any::<u64>(), 0..300),
                (0u64..1000, 0usize..300).prop_map(|(s, n)| (s..s + n as u64).collect()),
            ],
            absent in prop::collection::vec(any::<u64>(), 0..20),
        ) {
            let entries: Vec<(KeyId, usize)> =
                ids.iter().enumerate().map(|(n, &id)| (KeyId(id), n)).collect();
            let index = KeyIndex::build(entries.clone());
            let map: HashMap<KeyId, usize> = entries.iter().copied().collect();
            prop_assert_eq!(index.len(), map.len());
            prop_assert_eq!(index.is_empty(), map.is_empty());
            for id in ids.iter().chain(&absent).flat_map(|&i| [i, i.wrapping_add(1)]) {
                prop_assert_eq!(index.get(KeyId(id)), map.get(&KeyId(id)));
            }
            let mut values: Vec<usize> = index.values().copied().collect();
            let mut expected: Vec<usize> = map.values().copied().collect();
            values.sort_unstable();
            expected.sort_unstable();
            prop_assert_eq!(values, expected);
        }
    }

    #[test]
    fn a_lookup_runs_meanwhile_once_whether_or_not_the_id_is_held() {
        let index = KeyIndex::build(vec![(KeyId(7), "seven")]);
        let mut runs = 0;
        let (found, made) = index.get_meanwhile(KeyId(7), || {
            runs += 1;
            "hashed"
        });
        assert_eq!((found, made), (Some(&"seven"), "hashed"));
        let (found, ()) = index.get_meanwhile(KeyId(8), || runs += 1);
        assert_eq!(found, None);
        assert_eq!(runs, 2);
        assert!(KeyIndex::<u8>::default().get(KeyId(0)).is_none());
    }
}
