//! Request ids: 24 hex digits, a random 32-bit prefix chosen at start and a counter, so ids are
//! unique within a process and, with the prefix, almost surely across restarts and a fleet.
//! Rendered once per request as the header value that goes upstream and back to the client;
//! both share it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use http::HeaderValue;
use once_cell::sync::Lazy;

static IDS: Lazy<([u8; 4], AtomicU64)> = Lazy::new(|| {
    let mut prefix = [0u8; 4];
    let _ = getrandom::fill(&mut prefix);
    (prefix, AtomicU64::new(0))
});

/// One request's id, as the `X-Request-Id` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(HeaderValue);

impl RequestId {
    /// The next id of this process.
    pub fn next() -> RequestId {
        let (prefix, counter) = &*IDS;
        let mut bytes = [0u8; 12];
        bytes[..4].copy_from_slice(prefix);
        bytes[4..].copy_from_slice(&counter.fetch_add(1, Ordering::Relaxed).to_be_bytes());
        let mut text = [0u8; 24];
        hex::encode_to_slice(bytes, &mut text).expect("24 digits for 12 bytes");
        RequestId(HeaderValue::from_bytes(&text).expect("hex digits are header text"))
    }

    /// The header value (shared, not copied).
    pub fn header(&self) -> HeaderValue {
        self.0.clone()
    }

    /// The id as text, for logs.
    pub fn as_str(&self) -> &str {
        // Hex digits only, so always text.
        self.0.to_str().unwrap_or_default()
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
    fn ids_are_24_hex_digits_and_count_up() {
        let (a, b) = (RequestId::next(), RequestId::next());
        for id in [&a, &b] {
            assert_eq!(id.as_str().len(), 24);
            assert!(id.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
            assert_eq!(id.to_string(), id.as_str());
            assert_eq!(id.header().as_bytes(), id.as_str().as_bytes());
        }
        assert_eq!(a.as_str()[..8], b.as_str()[..8], "one prefix per process");
        let count = |id: &RequestId| u64::from_str_radix(&id.as_str()[8..], 16).unwrap();
        assert!(count(&b) > count(&a));
    }
}
