//! The pieces a value the gateway writes is made of ([`Piece`]), written where the value goes:
//! into a message's header lines with no `HeaderValue` between, or as a `HeaderValue` for the
//! header map of an HTTP/2 response ([`value_of`]).

use bytes::{BufMut, Bytes};
use http::HeaderValue;

use crate::client::Forwarded;
use crate::request_id::RequestId;

/// A piece of a value the gateway writes, each header text by its type: text of its own, a
/// number's digits, a request's id, a forwarded chain. Lines write pieces where they go, with
/// no `HeaderValue` between; only the map path builds one.
#[derive(Debug, Clone, Copy)]
pub enum Piece<'a> {
    /// The gateway's own header text (a policy name, a separator).
    Text(&'static str),
    /// A number, in decimal digits.
    Number(u64),
    /// A request's id (hex digits).
    Id(&'a RequestId),
    /// The `X-Forwarded-For` going upstream.
    Forwarded(&'a Forwarded),
}

impl Piece<'_> {
    /// The most bytes the piece writes, if that is bounded.
    fn max_len(self) -> Option<usize> {
        match self {
            Piece::Text(text) => Some(text.len()),
            Piece::Number(_) => Some(u64::MAX.ilog10() as usize + 1),
            Piece::Id(id) => Some(id.as_bytes().len()),
            Piece::Forwarded(_) => None,
        }
    }

    fn write(self, out: &mut impl BufMut) {
        match self {
            Piece::Text(text) => out.put_slice(text.as_bytes()),
            Piece::Number(n) => out.put_slice(itoa::Buffer::new().format(n).as_bytes()),
            Piece::Id(id) => out.put_slice(id.as_bytes()),
            Piece::Forwarded(forwarded) => forwarded.write(out),
        }
    }
}

/// Writes `pieces` one after another.
pub(super) fn write_pieces(pieces: &[Piece], out: &mut impl BufMut) {
    for piece in pieces {
        piece.write(out);
    }
}

/// `pieces` as a header value, marked as unique to its response if `is_unique` (see
/// [`Headers::insert_pieces`]). Written on the stack if it surely fits, as the values of the
/// map path do, so the value is its one allocation.
pub(crate) fn value_of(pieces: &[Piece], is_unique: bool) -> HeaderValue {
    let mut stack = [0u8; 128];
    let fits = pieces
        .iter()
        .try_fold(0, |total, piece| Some(total + piece.max_len()?))
        .is_some_and(|most| most <= stack.len());
    let value = if fits {
        let size = stack.len();
        let written = {
            let mut rest = &mut stack[..];
            write_pieces(pieces, &mut rest);
            size - rest.len()
        };
        HeaderValue::from_bytes(&stack[..written])
    } else {
        let mut text = Vec::new();
        write_pieces(pieces, &mut text);
        HeaderValue::from_maybe_shared(Bytes::from(text))
    };
    let mut value = value.expect("the gateway's own text and digits are header text");
    value.set_sensitive(is_unique);
    value
}
