// Animal Store's patch to pingora-http 0.9.1 (see `vendor/README.md`).

//! The case of a message's header names, kept without a second map while no name has two values.
//!
//! The published crate keeps the case in a second [`HMap`] beside the header map, on which every
//! append, insert and removal is repeated, so that the two iterate alike: each name is hashed and
//! stored twice, and a clone copies two maps. Most messages never have a name twice, and while
//! they do not, the header map's entries are its names, in order: a list of the names' case, one
//! per entry, in the entries' order, says the same. [`CaseNames::List`] is that list; the first
//! time a name gets a second value the list becomes the published map ([`CaseNames::Map`]).
//!
//! The list follows how `http`'s map keeps its entries: a new name is appended at the end, an
//! insert over a name replaces its value in place, and a removal moves the last entry into the
//! place of the one removed (`swap_remove`). The tests below check it, against the published
//! two maps, over long random sequences of the three operations; they fail if a new `http`
//! changes any of this. Where the writer still finds a name in the list that is not its entry's
//! (which these rules rule out), it writes the entry's own name rather than the wrong one.

use crate::case_header_name::CaseHeaderName;
use crate::{CaseMap, HMap};
use http::header::{AsHeaderName, HeaderName, HeaderValue, MaxSizeReached};

/// The case of a message's header names (see the module's documentation).
#[derive(Debug, Clone)]
pub(crate) enum CaseNames {
    /// `list[i]` is the header map's `i`-th entry's name, with its case; no name has two values.
    /// The name is kept beside its case so that checking the two lists against each other is
    /// a comparison of names, most of them standard ones (one byte each), not of their letters.
    List(Vec<(HeaderName, CaseHeaderName)>),
    /// The published map of names, on which every operation on the header map is repeated.
    Map(CaseMap),
}

impl CaseNames {
    /// Room for `capacity` names.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        CaseNames::List(Vec::with_capacity(capacity))
    }

    /// Appends `value` under `name` to `values`, and `case` to the names; whether `values` held
    /// `name` already (as [`HMap::try_append`] says).
    pub(crate) fn append<T>(
        &mut self,
        values: &mut HMap<T>,
        name: HeaderName,
        case: CaseHeaderName,
        value: T,
    ) -> Result<bool, MaxSizeReached> {
        match self {
            CaseNames::Map(map) => {
                map.try_append(name.clone(), case)?;
                values.try_append(name, value)
            }
            CaseNames::List(list) => {
                let existed = values.try_append(name.clone(), value)?;
                if existed {
                    *self = CaseNames::Map(map_of(list, name, case)?);
                } else {
                    list.push((name, case));
                }
                Ok(existed)
            }
        }
    }

    /// Inserts `value` under `name` into `values` in place of the values it had, and `case` in
    /// place of their names.
    pub(crate) fn insert<T>(
        &mut self,
        values: &mut HMap<T>,
        name: HeaderName,
        case: CaseHeaderName,
        value: T,
    ) {
        match self {
            CaseNames::Map(map) => {
                map.insert(name.clone(), case);
                values.insert(name, value);
            }
            CaseNames::List(list) => {
                // An insert over a name keeps its entry where it was.
                match list.iter().position(|(key, _)| *key == name) {
                    Some(i) => list[i].1 = case,
                    None => list.push((name.clone(), case)),
                }
                values.insert(name, value);
            }
        }
    }

    /// Removes `name`'s values from `values`, and their names; the first value removed.
    pub(crate) fn remove<'a, T, N: ?Sized>(
        &mut self,
        values: &mut HMap<T>,
        name: &'a N,
    ) -> Option<T>
    where
        &'a N: 'a + AsHeaderName,
    {
        let removed = values.remove(name)?;
        match self {
            CaseNames::Map(map) => {
                map.remove(name);
            }
            CaseNames::List(list) => {
                // The map moved its last entry into the removed one's place, unless the removed
                // one was the last: find where the last name is now.
                let (last, _) = list.last().expect("a removed name was in the list");
                match values.keys().position(|key| key == last) {
                    Some(i) => {
                        list.swap_remove(i);
                    }
                    None => {
                        list.pop();
                    }
                }
            }
        }
        Some(removed)
    }

    /// Each value of `values` with its name's case, in `values`' order.
    pub(crate) fn iter<'a>(&'a self, values: &'a HMap) -> Iter<'a> {
        match self {
            CaseNames::List(list) => Iter::List(list.iter().zip(values.iter())),
            CaseNames::Map(map) => Iter::Map(map.iter().zip(values.iter())),
        }
    }
}

/// The published map of names for a header map whose entries' names are `list`, and which has
/// just taken a second value under `name`, spelt `case`.
fn map_of(
    list: &mut Vec<(HeaderName, CaseHeaderName)>,
    name: HeaderName,
    case: CaseHeaderName,
) -> Result<CaseMap, MaxSizeReached> {
    let mut map = CaseMap::try_with_capacity(list.len() + 1)?;
    for (key, spelt) in list.drain(..) {
        map.try_append(key, spelt)?;
    }
    map.try_append(name, case)?;
    Ok(map)
}

/// A header's name, as its case was kept, or as the map spells it.
pub(crate) enum Name<'a> {
    /// The name as the message had it.
    Case(&'a CaseHeaderName),
    /// The map's own name (never written while the rules above hold).
    Map(&'a HeaderName),
}

impl Name<'_> {
    /// The name's bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Name::Case(case) => case.as_slice(),
            Name::Map(name) => name.as_str().as_bytes(),
        }
    }
}

/// The iterator of [`CaseNames::iter`].
pub(crate) enum Iter<'a> {
    List(
        std::iter::Zip<
            std::slice::Iter<'a, (HeaderName, CaseHeaderName)>,
            http::header::Iter<'a, HeaderValue>,
        >,
    ),
    Map(
        std::iter::Zip<http::header::Iter<'a, CaseHeaderName>, http::header::Iter<'a, HeaderValue>>,
    ),
}

impl<'a> Iterator for Iter<'a> {
    type Item = (Name<'a>, &'a HeaderValue);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Iter::List(iter) => {
                let ((listed, case), (name, value)) = iter.next()?;
                if listed == name {
                    Some((Name::Case(case), value))
                } else {
                    debug_assert!(false, "case list out of step: {listed} for {name}");
                    Some((Name::Map(name), value))
                }
            }
            Iter::Map(iter) => {
                let ((h1, case), (h2, value)) = iter.next()?;
                // in case the header iteration order changes in future versions of HMap
                assert_eq!(h1, h2, "header iter mismatch {}, {}", h1, h2);
                Some((Name::Case(case), value))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case_header_name::IntoCaseHeaderName;

    /// The published way: a second map, on which every operation is repeated.
    #[derive(Default)]
    struct Published {
        names: CaseMap,
        values: HMap,
    }

    impl Published {
        fn pairs(&self) -> Vec<(Vec<u8>, HeaderValue)> {
            self.names
                .iter()
                .zip(self.values.iter())
                .map(|((h1, case), (h2, value))| {
                    assert_eq!(h1, h2);
                    (case.as_slice().to_vec(), value.clone())
                })
                .collect()
        }
    }

    fn pairs(names: &CaseNames, values: &HMap) -> Vec<(Vec<u8>, HeaderValue)> {
        names
            .iter(values)
            .map(|(name, value)| (name.as_slice().to_vec(), value.clone()))
            .collect()
    }

    /// A small xorshift generator: the sequences are random, and the same on every run.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    /// Names in several spellings, standard and not, so that operations meet the same name
    /// spelt otherwise.
    const NAMES: &[&str] = &[
        "Host",
        "host",
        "HOST",
        "Content-Length",
        "content-length",
        "X-Foo",
        "x-foo",
        "X-FOO",
        "Set-Cookie",
        "Authorization",
        "X-Bar",
        "Via",
        "x-a",
        "X-B",
        "Date",
        "Connection",
    ];

    /// Every sequence of appends, inserts and removals leaves the list naming each value as the
    /// published two maps do, and the list stays a list as long as no name has two values.
    #[test]
    fn the_list_names_each_value_as_the_published_maps_do() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut lists_seen = 0;
        let mut maps_seen = 0;
        for _ in 0..2_000 {
            let mut names = CaseNames::with_capacity(rng.below(12));
            let mut values = HMap::new();
            let mut published = Published::default();
            let mut duplicated = false;
            for step in 0..rng.below(40) {
                let spelling = NAMES[rng.below(NAMES.len())];
                let name = HeaderName::from_bytes(spelling.as_bytes()).unwrap();
                let value = HeaderValue::from_str(&format!("v{step}")).unwrap();
                match rng.below(5) {
                    0 | 1 => {
                        let had = values.contains_key(&name);
                        duplicated |= had;
                        let existed = names
                            .append(
                                &mut values,
                                name.clone(),
                                spelling.into_case_header_name(),
                                value.clone(),
                            )
                            .unwrap();
                        assert_eq!(existed, had);
                        published
                            .names
                            .append(name.clone(), spelling.into_case_header_name());
                        published.values.append(name, value);
                    }
                    2 | 3 => {
                        names.insert(
                            &mut values,
                            name.clone(),
                            spelling.into_case_header_name(),
                            value.clone(),
                        );
                        published
                            .names
                            .insert(name.clone(), spelling.into_case_header_name());
                        published.values.insert(name, value);
                    }
                    _ => {
                        let removed = names.remove(&mut values, spelling);
                        published.names.remove(spelling);
                        assert_eq!(removed, published.values.remove(spelling));
                    }
                }
                assert_eq!(pairs(&names, &values), published.pairs());
                assert_eq!(values, published.values);
                match &names {
                    CaseNames::List(list) => {
                        assert!(!duplicated, "a list after a name had two values");
                        assert_eq!(list.len(), values.keys_len());
                        lists_seen += 1;
                    }
                    CaseNames::Map(_) => {
                        assert!(duplicated, "a map before any name had two values");
                        maps_seen += 1;
                    }
                }
            }
        }
        assert!(
            lists_seen > 10_000 && maps_seen > 10_000,
            "{lists_seen} {maps_seen}"
        );
    }

    /// A name appended twice turns the list into the published map, with both spellings kept.
    #[test]
    fn a_second_value_under_a_name_turns_the_list_into_a_map() {
        let mut names = CaseNames::with_capacity(4);
        let mut values = HMap::new();
        for (name, value) in [("Set-Cookie", "a=1"), ("Via", "x"), ("set-cookie", "b=2")] {
            names
                .append(
                    &mut values,
                    HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    name.into_case_header_name(),
                    HeaderValue::from_static(value),
                )
                .unwrap();
        }
        assert!(matches!(names, CaseNames::Map(_)));
        let got: Vec<_> = names
            .iter(&values)
            .map(|(name, value)| (name.as_slice().to_vec(), value.clone()))
            .collect();
        assert_eq!(
            got,
            [
                (b"Set-Cookie".to_vec(), HeaderValue::from_static("a=1")),
                (b"set-cookie".to_vec(), HeaderValue::from_static("b=2")),
                (b"Via".to_vec(), HeaderValue::from_static("x")),
            ]
        );
    }
}
