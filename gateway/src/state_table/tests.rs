//! Unit tests of [`super`] (`state_table.rs` and `state_table/shard.rs`).

use super::shard::FIRST_CAPACITY;
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
