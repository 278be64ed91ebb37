//! The embedded limit store's files in the data directory, `limits.bin` (a snapshot of every
//! key's state) and `limits.journal` (batches of the states that changed since), and how they
//! read back. [`super::embedded`] decides when each is written.
//!
//! Both files are little-endian `u64` words. `limits.bin`: a magic word, the generation, a
//! count, then nine words per key (id, minute start + 1 or 0, minute count, refused in window,
//! day, day count, ban end, last ban start + 1 or 0, ban level); the first format had no
//! generation and reads as generation 0. `limits.journal`: a magic word, the generation, then
//! batches: a count, nine words per key as in the snapshot, and the batch's FNV-1a checksum.

use crate::keys::KeyId;
use crate::limits::KeyState;

/// `ASLIMIT1` in ASCII: the first snapshot layout, without a generation.
const MAGIC_V1: u64 = u64::from_le_bytes(*b"ASLIMIT1");
/// `ASLIMIT2`: the snapshot layout with a generation.
const MAGIC: u64 = u64::from_le_bytes(*b"ASLIMIT2");
/// `ASLJRNL1`: the journal.
const JOURNAL_MAGIC: u64 = u64::from_le_bytes(*b"ASLJRNL1");
/// Words a key takes in either file: its id and the eight fields of its state.
const WORDS_PER_KEY: usize = 9;
/// Which of a key's fields ([`KeyState::fields`]) may be absent: the minute window's start and
/// the last ban's. The files store those one more than themselves, and absent as 0; the others
/// as they are.
const OPTIONAL: [bool; 8] = [true, false, false, false, false, false, true, false];

/// FNV-1a over `bytes`: enough to tell a batch cut short from a whole one.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn put_state(out: &mut Vec<u8>, id: KeyId, state: &KeyState) {
    out.extend_from_slice(&id.0.to_le_bytes());
    for (field, optional) in state.fields().into_iter().zip(OPTIONAL) {
        let word = if optional {
            field.map_or(0, |v| v + 1)
        } else {
            field.unwrap_or(0)
        };
        out.extend_from_slice(&word.to_le_bytes());
    }
}

fn take_state(words: &mut impl Iterator<Item = u64>) -> Option<(KeyId, KeyState)> {
    let id = KeyId(words.next()?);
    let mut fields = [None; 8];
    for (field, optional) in fields.iter_mut().zip(OPTIONAL) {
        let word = words.next()?;
        *field = if optional {
            word.checked_sub(1)
        } else {
            Some(word)
        };
    }
    Some((id, KeyState::from_fields(fields)))
}

fn words(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
}

pub(super) fn journal_header(generation: u64) -> Vec<u8> {
    [JOURNAL_MAGIC, generation]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect()
}

/// The length of a journal batch of `keys` states.
pub(super) fn batch_len(keys: usize) -> u64 {
    (16 + keys * WORDS_PER_KEY * 8) as u64
}

/// A journal batch of `states`: a count, the states, a checksum of both.
pub(super) fn batch(states: &[(KeyId, KeyState)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(batch_len(states.len()) as usize);
    out.extend_from_slice(&(states.len() as u64).to_le_bytes());
    for (id, state) in states {
        put_state(&mut out, *id, state);
    }
    let sum = checksum(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// The journal's generation, and the changes of its whole batches if that generation is
/// `generation` (none otherwise: the journal belongs to another snapshot).
pub(super) fn replay(bytes: &[u8], generation: u64) -> (Option<u64>, Vec<(KeyId, KeyState)>) {
    let mut header = words(bytes);
    if header.next() != Some(JOURNAL_MAGIC) {
        return (None, Vec::new());
    }
    let Some(journal_generation) = header.next() else {
        return (None, Vec::new());
    };
    let mut changes = Vec::new();
    if journal_generation != generation {
        return (Some(journal_generation), changes);
    }
    let mut rest = &bytes[16..];
    while let Some(count) = words(rest).next() {
        let Some(len) = usize::try_from(count)
            .ok()
            .and_then(|n| n.checked_mul(WORDS_PER_KEY * 8))
            .and_then(|n| n.checked_add(16))
            .filter(|&n| n <= rest.len())
        else {
            break;
        };
        let (body, sum) = rest[..len].split_at(len - 8);
        if words(sum).next() != Some(checksum(body)) {
            break;
        }
        let mut states = words(&body[8..]);
        changes.extend(std::iter::from_fn(|| take_state(&mut states)));
        rest = &rest[len..];
    }
    (Some(journal_generation), changes)
}

/// A snapshot of generation `generation` of the states `states` hands to its argument, about
/// `keys` of them; the count is filled in once they are all written.
pub(super) fn encode(
    generation: u64,
    keys: usize,
    states: impl FnOnce(&mut dyn FnMut(KeyId, &KeyState)),
) -> Vec<u8> {
    let mut out = Vec::with_capacity(24 + keys * WORDS_PER_KEY * 8);
    for word in [MAGIC, generation, 0] {
        out.extend_from_slice(&word.to_le_bytes());
    }
    let mut count = 0u64;
    states(&mut |id, state| {
        put_state(&mut out, id, state);
        count += 1;
    });
    out[16..24].copy_from_slice(&count.to_le_bytes());
    out
}

/// The snapshot's generation and states.
pub(super) fn decode(bytes: &[u8]) -> Option<(u64, Vec<(KeyId, KeyState)>)> {
    let mut words = words(bytes);
    if !bytes.len().is_multiple_of(8) {
        return None;
    }
    let (generation, header) = match words.next()? {
        MAGIC_V1 => (0, 16),
        MAGIC => (words.next()?, 24),
        _ => return None,
    };
    let count = usize::try_from(words.next()?).ok()?;
    if bytes.len() != header + count.checked_mul(WORDS_PER_KEY * 8)? {
        return None;
    }
    let states: Vec<_> = std::iter::from_fn(|| take_state(&mut words))
        .take(count)
        .collect();
    (states.len() == count).then_some((generation, states))
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;

    use super::*;

    const T0: u64 = 1_795_341_600_000;

    fn encode_all(generation: u64, states: &[(KeyId, KeyState)]) -> Vec<u8> {
        encode(generation, states.len(), |put| {
            states.iter().for_each(|(id, state)| put(*id, state))
        })
    }

    #[test]
    fn encoding_round_trips() {
        let state = KeyState {
            minute_start_ms: NonZeroU64::new(1),
            minute_count: u32::MAX,
            day: 20_000,
            day_count: 1 << 40,
            refused_in_window: 4,
            ban_until_ms: 9,
            ban_last_start_ms: None,
            ban_level: 3,
            ..KeyState::default()
        };
        let states = vec![(KeyId(u64::MAX), state), (KeyId(0), KeyState::default())];
        assert_eq!(
            decode(&encode_all(7, &states)).unwrap(),
            (7, states.clone())
        );
        assert!(decode(&encode_all(7, &states)[..20]).is_none());
        let mut journal = journal_header(7);
        journal.extend(batch(&states[..1]));
        journal.extend(batch(&states[1..]));
        assert_eq!(batch(&states).len() as u64, batch_len(states.len()));
        assert_eq!(replay(&journal, 7), (Some(7), states));
    }

    /// The first file format, without a generation, still reads: as generation 0, with the
    /// same records.
    #[test]
    fn a_snapshot_in_the_first_format_reads_back() {
        let words: [u64; 11] = [MAGIC_V1, 1, 7, T0 + 1, 5, 2, 20_781, 9, 0, T0 - 999 + 1, 1];
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let (generation, states) = decode(&bytes).unwrap();
        assert_eq!(generation, 0);
        assert_eq!(
            states,
            vec![(
                KeyId(7),
                KeyState {
                    minute_start_ms: NonZeroU64::new(T0),
                    minute_count: 5,
                    day: 20_781,
                    day_count: 9,
                    refused_in_window: 2,
                    ban_until_ms: 0,
                    ban_last_start_ms: NonZeroU64::new(T0 - 999),
                    ban_level: 1,
                    ..KeyState::default()
                },
            )]
        );
        assert_eq!(encode_all(0, &states)[24..], bytes[16..]);
    }
}
