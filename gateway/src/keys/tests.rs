//! Unit tests of [`super`] (`keys.rs`): format, validation, rotation and revocation.

use super::*;
use crate::key_set::KeySet;
use proptest::prelude::*;

#[test]
fn a_refused_duration_is_written_in_its_largest_whole_unit() {
    let written = |secs| in_largest_unit(std::time::Duration::from_secs(secs));
    assert_eq!(written(86_400_000_000), "1000000d");
    assert_eq!(written(5_400), "90m");
    assert_eq!(written(7_200), "2h");
    assert_eq!(written(90), "90s");
    assert_eq!(written(0), "0s");
    assert_eq!(
        in_largest_unit(std::time::Duration::from_millis(500)),
        "500ms"
    );
}

#[test]
fn generated_keys_parse_and_are_distinct() {
    let (id1, k1) = generate().unwrap();
    let (id2, k2) = generate().unwrap();
    assert_ne!(k1, k2);
    assert_eq!(id_of_key(&k1), Some(id1));
    assert_eq!(id_of_key(&k2), Some(id2));
    assert_eq!(k1.len(), 3 + 16 + 1 + 64);
}

#[test]
fn a_key_is_rotated_once_unless_its_successor_was_revoked() {
    let overlap = std::time::Duration::from_secs(3600);
    let (first, _) = new_key(&Plans::defaults(), NewKey::on("free")).unwrap();
    let mut keys = vec![first.clone()];
    let (successor, _) = rotate_in(&mut keys, &first.id, overlap).unwrap();
    let again = rotate_in(&mut keys, &first.id, overlap).unwrap_err();
    assert!(again.to_string().contains("already rotated"), "{again}");

    revoke_in(&mut keys, &successor.id).unwrap();
    let (second, _) = rotate_in(&mut keys, &first.id, overlap).unwrap();
    assert_eq!(keys[0].successor.as_deref(), Some(second.id.as_str()));
    assert_eq!(second.counters.as_deref(), Some(first.id.as_str()));
    assert!(
        keys[0].usable(unix_now()),
        "the old key works through the overlap"
    );
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics_the_key_parser(s in ".{0,120}") {
        let _ = id_of_key(&s);
        let set = KeySet::default();
        prop_assert!(set.find(&s).is_none());
    }

    /// `KeyId::parse` reads what `u64::from_str_radix` reads, and refuses the rest: the bytes
    /// beside each range of hex digits included.
    #[test]
    fn the_id_parser_agrees_with_from_str_radix(
        s in prop_oneof!["[0-9a-fA-F]{15,17}", "[0-9a-fA-F/:@G`g]{16}", ".{0,20}"],
    ) {
        let radix = (s.len() == ID_BYTES * 2 && s.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u64::from_str_radix(&s, 16).ok().map(KeyId))
            .flatten();
        prop_assert_eq!(KeyId::parse(&s), radix);
    }

    /// `id_of_key` accepts what splitting at the first `_` and checking both halves accepts,
    /// with the same id: near-keys (a digit or `_` moved, dropped or changed) included.
    #[test]
    fn the_key_parser_agrees_with_a_split_at_the_first_underscore(
        s in prop_oneof![
            "as_[0-9a-fA-F]{15,17}[_g]?[0-9a-fA-F]{63,65}",
            "as_[0-9a-f_]{15,17}_[0-9a-f_]{63,65}",
            "as_.{0,90}",
        ],
    ) {
        let hex = |t: &str, len: usize| {
            t.len() == len && t.bytes().all(|b| b.is_ascii_hexdigit())
        };
        let by_split = s
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split_once('_'))
            .filter(|(id, secret)| hex(id, ID_BYTES * 2) && hex(secret, SECRET_BYTES * 2))
            .and_then(|(id, _)| u64::from_str_radix(id, 16).ok().map(KeyId));
        prop_assert_eq!(id_of_key(&s), by_split);
    }
}
