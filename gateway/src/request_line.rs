//! The request line of an HTTP/1.1 request, checked in the bytes the client sent.
//!
//! pingora's parser refuses a request target with a space, a control character or DEL in it,
//! and pingora then percent-encodes those bytes and parses the request again: the gateway would
//! decide on, and forward, a target the client never sent (`GET /v1/pets x HTTP/1.1` would
//! become `/v1/pets%20x`). RFC 9112, section 3.2, says a server should answer an invalid request
//! line with 400 rather than correct it, since such a line may be crafted to slip past the
//! filters along a request's way; nginx answers 400. So [`crate::client_stream`] runs
//! [`check`] over the bytes of each request head as pingora reads them, and the gateway refuses
//! a request whose line failed it (`400 invalid_request`) before any decision.
//!
//! A valid line has two spaces (around the target) and no other byte below `!` or DEL, and ends
//! at a line feed, after a carriage return or not. Blank lines before it are skipped, as
//! pingora skips them.

/// How far the check of one request line has got.
pub type State = u8;

/// Before the line.
pub const START: State = 0;
/// In the line, after no, one or two spaces: `IN_LINE + spaces`.
const IN_LINE: State = 1;
/// After a carriage return in the line: only a line feed may follow.
const RETURN: State = 4;
/// The line ended and was valid; also where a stream that checks nothing stays.
pub const VALID: State = 5;
/// The line has a byte a request line may not have where it is.
pub const INVALID: State = 6;

/// Takes `bytes`, the next bytes of a request head, into the check at `state`.
#[inline]
pub fn check(state: &mut State, bytes: &[u8]) {
    if *state < VALID {
        *state = scan(*state, bytes);
    }
}

/// The line's end is found with `memchr`, and its bytes are counted 16 at a time ([`count`]):
/// about 200 instructions a GET under callgrind, against 550 a byte at a time.
fn scan(mut state: State, mut bytes: &[u8]) -> State {
    if state == START {
        match bytes.iter().position(|&b| b != b'\r' && b != b'\n') {
            Some(text) => bytes = &bytes[text..],
            None => return START,
        }
        state = IN_LINE;
    }
    let (line, ended) = match memchr::memchr(b'\n', bytes) {
        Some(end) => (&bytes[..end], true),
        None => (bytes, false),
    };
    if state == RETURN {
        return match (line.is_empty(), ended) {
            (true, true) => VALID,
            (true, false) => RETURN,
            (false, _) => INVALID,
        };
    }
    // A carriage return may stand only right before the line feed.
    let (line, carriage_return) = match line {
        [line @ .., b'\r'] => (line, true),
        _ => (line, false),
    };
    let (mut spaces, control) = count(line);
    spaces += usize::from(state - IN_LINE);
    match spaces {
        _ if control => INVALID,
        3.. => INVALID,
        _ if ended => VALID,
        _ if carriage_return => RETURN,
        // At most 2: the cast keeps it.
        _ => IN_LINE + spaces as State,
    }
}

/// The spaces in `line`, and whether it has a control character or DEL.
fn count(line: &[u8]) -> (usize, bool) {
    /// One chunk's, in byte lanes that the compiler vectorizes.
    fn chunk(bytes: &[u8; 16]) -> (u8, bool) {
        let (mut spaces, mut control) = (0u8, 0u8);
        for &b in bytes {
            spaces += u8::from(b == b' ');
            control |= u8::from(b < b' ') | u8::from(b == 0x7f);
        }
        (spaces, control != 0)
    }
    let chunks = line.chunks_exact(16);
    // The rest, padded with bytes that are neither.
    let mut rest = [b'.'; 16];
    rest[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    let (mut spaces, mut control) = (0, false);
    for bytes in chunks
        .map(|c| c.try_into().expect("16 bytes"))
        .chain([&rest])
    {
        let (s, c) = chunk(bytes);
        spaces += usize::from(s);
        control |= c;
    }
    (spaces, control)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The rule, a byte at a time: what [`scan`] must agree with.
    fn by_byte(mut state: State, bytes: &[u8]) -> State {
        for &b in bytes {
            state = match b {
                _ if state >= VALID => return state,
                b'\r' | b'\n' if state == START => START,
                b'\n' => return VALID,
                _ if state == RETURN => return INVALID,
                b'\r' => RETURN,
                b' ' if state < IN_LINE + 2 => state.max(IN_LINE) + 1,
                b' ' | 0..=0x1f | 0x7f => return INVALID,
                _ => state.max(IN_LINE),
            };
        }
        state
    }

    fn checked(pieces: &[&[u8]]) -> State {
        let mut state = START;
        for piece in pieces {
            check(&mut state, piece);
        }
        state
    }

    #[test]
    fn a_space_a_control_character_or_del_fails_and_only_the_line_is_looked_at() {
        for (line, verdict) in [
            (&b"GET /v1/pets HTTP/1.1\r\n"[..], VALID),
            (b"GET /v1/pets?name=a%20b HTTP/1.1\nHost: x\r\n\r\n", VALID),
            (b"\r\n\r\nPOST /v1/pets HTTP/1.0\r\n", VALID),
            (
                b"\nGET /<\"caf\xc3\xa9\"> HTTP/1.1\r\nX-Tab:\ta b c\r\n\r\n",
                VALID,
            ),
            (b"GET http://x/v1/pets HTTP/1.1\r\n", VALID),
            (b"GET /v1/pets x HTTP/1.1\r\n", INVALID),
            (b"GET /v1/pets\tx HTTP/1.1\r\n", INVALID),
            (b"GET /v1/pets\x7f HTTP/1.1\r\n", INVALID),
            (b"GET /v1/pets\x00 HTTP/1.1\r\n", INVALID),
            (b"GET /v1/pets\rx HTTP/1.1\r\n", INVALID),
            (b"GET /v1/pets HTTP/1.1\r\r\n", INVALID),
            (b"GET  /v1/pets HTTP/1.1\r\n", INVALID),
            (b"GET /v1/pets HTTP/1.1 \r\n", INVALID),
        ] {
            assert_eq!(checked(&[line]), verdict, "{:?}", line.escape_ascii());
        }
    }

    #[test]
    fn a_line_that_has_not_ended_is_neither() {
        assert_eq!(checked(&[b"\r\n"]), START);
        assert_eq!(checked(&[b"GET"]), IN_LINE);
        assert_eq!(checked(&[b"GET /v1/pets HTTP/1.1\r"]), RETURN);
    }

    proptest! {
        /// However the head is cut into reads, the verdict is the same, and it is the rule's.
        #[test]
        fn the_verdict_is_the_rules_however_the_head_is_read(
            line in proptest::collection::vec(
                prop_oneof![
                    Just(b' '), Just(b'\r'), Just(b'\n'), Just(b'\t'), Just(0x7f), Just(b'a'),
                    any::<u8>(),
                ],
                0..40,
            ),
            cuts in proptest::collection::vec(0usize..40, 0..4),
        ) {
            let whole = checked(&[&line]);
            prop_assert_eq!(whole, by_byte(START, &line));
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(line.len())).collect();
            cuts.sort_unstable();
            let mut pieces = Vec::new();
            let mut from = 0;
            for cut in cuts {
                pieces.push(&line[from..cut]);
                from = cut;
            }
            pieces.push(&line[from..]);
            prop_assert_eq!(checked(&pieces), whole);
        }
    }
}
