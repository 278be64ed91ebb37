//! HTTP/1.1 pipelining (RFC 9112, section 9.3.2): a client may send its next requests before it
//! has read the answer to the last, as `wrk` with a pipelining script and some HTTP libraries do.
//!
//! pingora reads a request head with whatever else the read brings, the pipelined requests
//! behind it too. It cannot hand those bytes on through the gateway's keep-alive loop
//! ([`crate::connections`], which waits on the connection between requests), so it would close
//! the connection after the first answer and leave the rest unanswered. [`Heads`] cuts every read
//! of a client connection at the end of a request head and holds what follows for the next
//! reads: pingora never reads a head past the request it is serving, and the keep-alive loop
//! sees the held bytes as a request waiting.
//!
//! The rest of a request pingora reads only up to its end: a body of declared length exactly,
//! and a chunked body up to its last chunk, which ends with a blank line too. The one byte
//! pingora reads while proxying, to see whether the client has gone, it keeps for the next
//! request (its pipelining setting, [`crate::connections`]); the rest of that request stays
//! here or on the connection. A blank line inside a body only costs one more read.
//!
//! A head's end is a blank line: a line feed, then an optional carriage return and a line feed.
//! That covers `\r\n\r\n` and the bare line feeds pingora's parser also accepts.

use std::sync::LazyLock;

use bytes::{Buf, Bytes};
use memchr::memmem::Finder;
use tokio::io::ReadBuf;

/// One client connection's reads, cut at the ends of request heads.
#[derive(Debug, Default)]
pub struct Heads {
    /// Read from the connection and not yet delivered: the requests after the one being read.
    held: Bytes,
    /// Where the bytes delivered last left a blank line that may end in the next ones.
    state: Blank,
}

impl Heads {
    /// Whether bytes of a next request are held, waiting to be read.
    pub fn waiting(&self) -> bool {
        !self.held.is_empty()
    }

    /// Reads from what is held into `buf`, up to the end of the first request head in it.
    pub fn deliver(&mut self, buf: &mut ReadBuf<'_>) {
        let fits = self.held.len().min(buf.remaining());
        let n = cut(&mut self.state, &self.held[..fits]);
        buf.put_slice(&self.held[..n]);
        self.held.advance(n);
        if self.held.is_empty() {
            // Emptied, it would still keep its allocation.
            self.held = Bytes::new();
        }
    }

    /// Holds `bytes`, read from the connection while nothing was held, for the next reads.
    pub fn hold(&mut self, bytes: &[u8]) {
        debug_assert!(!self.waiting());
        if !bytes.is_empty() {
            self.held = Bytes::copy_from_slice(bytes);
        }
    }

    /// After a read from the connection put new bytes into `buf` from `start` on: keeps what
    /// follows the end of the first request head among them for the next reads.
    pub fn after_read(&mut self, buf: &mut ReadBuf<'_>, start: usize) {
        let fresh = &buf.filled()[start..];
        let n = cut(&mut self.state, fresh);
        if n < fresh.len() {
            self.held = Bytes::copy_from_slice(&fresh[n..]);
            buf.set_filled(start + n);
        }
    }
}

/// How far into a blank line the bytes so far are.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Blank {
    /// Not in one.
    #[default]
    Outside,
    /// After a line feed.
    LineFeed,
    /// After a line feed and a carriage return.
    Return,
}

/// A blank line after a line that ends in a carriage return and a line feed, or in a bare one.
static BLANK_AFTER_CRLF: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\n\r\n"));
/// A blank line of a bare line feed.
static BLANK_AFTER_LF: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\n\n"));

/// How many of `bytes` to deliver: up to the end of the first blank line, or all of them.
/// `state` is where the bytes delivered before them left off, and becomes where the delivered
/// ones leave off.
fn cut(state: &mut Blank, bytes: &[u8]) -> usize {
    // A blank line begun by the bytes delivered before.
    let carried = match (*state, bytes) {
        (Blank::LineFeed | Blank::Return, [b'\n', ..]) => Some(1),
        (Blank::LineFeed, [b'\r', b'\n', ..]) => Some(2),
        _ => None,
    };
    let end = carried.or_else(|| {
        let crlf = BLANK_AFTER_CRLF.find(bytes).map(|at| at + 3);
        let lf = BLANK_AFTER_LF.find(bytes).map(|at| at + 2);
        crlf.into_iter().chain(lf).min()
    });
    if let Some(end) = end {
        *state = Blank::Outside;
        return end;
    }
    // No blank line ends in them: how much of one they end with.
    *state = match (*state, bytes) {
        (_, [.., b'\n']) => Blank::LineFeed,
        (_, [.., b'\n', b'\r']) | (Blank::LineFeed, [b'\r']) => Blank::Return,
        (unchanged, []) => unchanged,
        _ => Blank::Outside,
    };
    bytes.len()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Reads `stream`, arriving from the connection in `arrivals` pieces, through `Heads` into
    /// buffers of `room` bytes: the bytes of each read.
    fn reads(stream: &[u8], arrivals: &[usize], room: usize) -> Vec<Vec<u8>> {
        let mut heads = Heads::default();
        let mut pieces = Vec::new();
        let mut at = 0;
        for &size in arrivals.iter().chain(std::iter::repeat(&usize::MAX)) {
            if at == stream.len() && !heads.waiting() {
                break;
            }
            let mut space = vec![0; room];
            let mut buf = ReadBuf::new(&mut space);
            if heads.waiting() {
                heads.deliver(&mut buf);
            } else {
                let arrived = &stream[at..at.saturating_add(size).min(stream.len())];
                let n = arrived.len().min(room);
                buf.put_slice(&arrived[..n]);
                at += n;
                heads.after_read(&mut buf, 0);
            }
            pieces.push(buf.filled().to_vec());
        }
        pieces
    }

    /// Where `stream`'s request heads end, found the slow way, a byte at a time: after each blank
    /// line, the next needs bytes of its own.
    fn head_ends(stream: &[u8]) -> Vec<usize> {
        let (mut ends, mut state) = (Vec::new(), Blank::Outside);
        for (i, &byte) in stream.iter().enumerate() {
            state = match (state, byte) {
                (Blank::LineFeed | Blank::Return, b'\n') => {
                    ends.push(i + 1);
                    Blank::Outside
                }
                (_, b'\n') => Blank::LineFeed,
                (Blank::LineFeed, b'\r') => Blank::Return,
                _ => Blank::Outside,
            };
        }
        ends
    }

    #[test]
    fn pipelined_heads_are_read_one_at_a_time() {
        let one = b"GET /v1/pets HTTP/1.1\r\nHost: x\r\n\r\n";
        let three = [&one[..], one, one].concat();
        assert_eq!(reads(&three, &[three.len()], 4096), vec![one.to_vec(); 3]);
    }

    #[test]
    fn heads_with_bare_line_feeds_are_cut_too() {
        let one = b"GET /v1/pets HTTP/1.1\nHost: x\n\n";
        let two = [&one[..], one].concat();
        assert_eq!(reads(&two, &[two.len()], 4096), vec![one.to_vec(); 2]);
    }

    #[test]
    fn a_blank_line_split_across_reads_is_found() {
        let stream = b"GET / HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n";
        for split in 14..19 {
            let pieces = reads(stream, &[split, stream.len()], 4096);
            assert_eq!(pieces.concat(), stream, "split at {split}");
            assert!(
                pieces
                    .iter()
                    .any(|p| p.ends_with(b"GET /b HTTP/1.1\r\n\r\n") && p.starts_with(b"GET /b")),
                "split at {split}: {pieces:?}"
            );
        }
    }

    #[test]
    fn a_read_of_one_request_is_left_whole() {
        let one = b"POST /v1/pets HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
        let mut heads = Heads::default();
        let mut space = [0; 128];
        let mut buf = ReadBuf::new(&mut space);
        buf.put_slice(one);
        heads.after_read(&mut buf, 0);
        assert_eq!(buf.filled().len(), one.len() - 2, "the head, then the body");
        assert!(heads.waiting());
    }

    proptest! {
        /// Whatever the requests and however they arrive, every byte is read once and in order,
        /// and no read runs past the end of a request head.
        #[test]
        fn no_read_runs_past_a_head(
            stream in proptest::collection::vec(
                prop_oneof![Just(b'\r'), Just(b'\n'), Just(b'G'), any::<u8>()], 0..400),
            arrivals in proptest::collection::vec(1usize..64, 0..40),
            room in 1usize..80,
        ) {
            let pieces = reads(&stream, &arrivals, room);
            prop_assert_eq!(pieces.concat(), stream.clone());
            let ends = head_ends(&stream);
            let mut at = 0;
            for piece in &pieces {
                let end = at + piece.len();
                prop_assert!(
                    !ends.iter().any(|&e| e > at && e < end),
                    "a read from {} to {} spans a head's end ({:?})", at, end, ends
                );
                at = end;
            }
        }
    }
}
