//! Request ids: 24 hex digits, a random 32-bit prefix chosen at start and a counter, so ids are
//! unique within a process and, with the prefix, almost surely across restarts and a fleet.
//! The counter is not shown as it is: it goes through a permutation of the 64-bit numbers keyed
//! at start, so ids stay unique but do not count up, and a client comparing two of its ids
//! learns nothing of how many requests the gateway served in between.
//! Held as its 24 digits, with no allocation: the header lines of the request going upstream
//! and of the response copy them where they go.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use once_cell::sync::Lazy;

/// A process's prefix, the keys of its permutation, and its counter.
struct Ids {
    prefix: [u8; 4],
    keys: [u64; 3],
    counter: AtomicU64,
}

static IDS: Lazy<Ids> = Lazy::new(|| {
    let mut random = [0u8; 28];
    let _ = getrandom::fill(&mut random);
    let key = |i: usize| u64::from_le_bytes(random[4 + 8 * i..12 + 8 * i].try_into().expect("8"));
    Ids {
        prefix: random[..4].try_into().expect("4 bytes"),
        keys: [key(0), key(1), key(2)],
        counter: AtomicU64::new(0),
    }
});

/// A permutation of the 64-bit numbers: two rounds of SplitMix64's finalizer (a bijection: each
/// step, an xor with a right shift of itself or a product with an odd number, can be undone),
/// with a key mixed in before, between and after.
fn permute(n: u64, keys: [u64; 3]) -> u64 {
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    mix(mix(n ^ keys[0]) ^ keys[1]) ^ keys[2]
}

/// One request's id, the `X-Request-Id` value: 24 hex digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId([u8; 24]);

impl RequestId {
    /// The next id of this process.
    pub fn next() -> RequestId {
        let ids = &*IDS;
        let n = ids.counter.fetch_add(1, Ordering::Relaxed);
        let mut bytes = [0u8; 12];
        bytes[..4].copy_from_slice(&ids.prefix);
        bytes[4..].copy_from_slice(&permute(n, ids.keys).to_be_bytes());
        let mut text = [0u8; 24];
        hex::encode_to_slice(bytes, &mut text).expect("24 digits for 12 bytes");
        RequestId(text)
    }

    /// The id's digits, as bytes of header text.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("hex digits are text")
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_24_hex_digits_with_one_prefix_per_process() {
        let (a, b) = (RequestId::next(), RequestId::next());
        for id in [&a, &b] {
            assert_eq!(id.as_str().len(), 24);
            assert!(id.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
            assert_eq!(id.to_string(), id.as_str());
            assert_eq!(id.as_bytes(), id.as_str().as_bytes());
        }
        assert_eq!(a.as_str()[..8], b.as_str()[..8], "one prefix per process");
        assert_ne!(a, b);
    }

    #[test]
    fn consecutive_ids_are_unique_and_do_not_count_up() {
        let keys = [
            0x0123_4567_89ab_cdef,
            0xfedc_ba98_7654_3210,
            0x0f0f_0f0f_f0f0_f0f0,
        ];
        let ids: Vec<u64> = (0..100_000).map(|n| permute(n, keys)).collect();
        let mut unique = ids.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ids.len());
        // Successive values go up about half the time, as random ones would, and differ in
        // about half their bits: the difference of two says nothing of the count between them.
        let ups = ids.windows(2).filter(|w| w[1] > w[0]).count();
        assert!((45_000..55_000).contains(&ups), "{ups} of 99,999 went up");
        let bits: u32 = ids.windows(2).map(|w| (w[0] ^ w[1]).count_ones()).sum();
        let mean = f64::from(bits) / 99_999.0;
        assert!(
            (30.0..34.0).contains(&mean),
            "{mean} bits differ on average"
        );
        // Another process's keys give other ids for the same counts.
        assert_ne!(permute(0, keys), permute(0, [1, 2, 3]));
    }
}
