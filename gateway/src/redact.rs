//! Credentials taken out of text before it is logged. The gateway's own lines never hold a key,
//! but pingora's debug lines may quote what a client sent: a request head it cannot parse, as
//! read (up to 2 KiB, `Authorization` included), or a request's target with its query. So every
//! line of the process's log but the access log (which is built from safe fields) goes through
//! [`redact`] first.
//!
//! What is taken out, wherever it stands: the credentials of an `Authorization` (or
//! `Proxy-Authorization`) field, its scheme kept, as a raw head, a header map's `Debug` or a
//! `name=value` pair writes it; and anything shaped like one of our keys, in a query string or a
//! header of the client's own, whose public id is kept (`as_9d4714c8eb0fc065_[redacted]`), as a
//! key's id is safe to log.

use std::borrow::Cow;
use std::ops::Range;

use crate::keys::{ID_BYTES, PREFIX};

/// What stands in for a credential.
pub const REDACTED: &str = "[redacted]";

/// `text` with every credential in it replaced by [`REDACTED`]; borrowed when it holds none.
pub fn redact(text: &str) -> Cow<'_, str> {
    let spans = secrets(text);
    if spans.is_empty() {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    for span in spans {
        out.push_str(&text[from..span.start]);
        // A key's public id stays: it names the key without opening anything.
        if let Some(id_end) = key_secret_start(text.as_bytes(), span.start) {
            out.push_str(&text[span.start..id_end]);
        }
        out.push_str(REDACTED);
        from = span.end;
    }
    out.push_str(&text[from..]);
    Cow::Owned(out)
}

/// The byte ranges of `text` that hold credentials, in order and not overlapping.
fn secrets(text: &str) -> Vec<Range<usize>> {
    let bytes = text.as_bytes();
    let mut spans = Vec::new();
    for at in find_ignoring_case(bytes, b"authorization") {
        // `Authorization: v`, `authorization=v`, or `"authorization": "v"` as a header map
        // prints it; not the word in a sentence ("send an Authorization header").
        let mut i = skip(bytes, at + b"authorization".len(), b"\"'");
        if !matches!(bytes.get(i), Some(b':' | b'=')) {
            continue;
        }
        i = skip(bytes, i + 1, b" \t\"'");
        let scheme = bytes[i..]
            .iter()
            .take_while(|b| b.is_ascii_alphabetic())
            .count();
        if scheme > 0 && bytes.get(i + scheme) == Some(&b' ') {
            i = skip(bytes, i + scheme, b" ");
        }
        // A credential starts with a token's character: not `<key>` in a message that says
        // what to send. It runs to the end of the field's value.
        if token_end(bytes, i) > i {
            let end = i + bytes[i..]
                .iter()
                .take_while(|&&b| !matches!(b, b'\r' | b'\n' | b'\\' | b'"' | b'\''))
                .count();
            spans.push(i..end);
        }
    }
    for (at, _) in text.match_indices(PREFIX) {
        if let Some(secret) = key_secret_start(bytes, at) {
            spans.push(at..token_end(bytes, secret));
        }
    }
    spans.retain(|span| !span.is_empty());
    merge(spans)
}

/// Where the secret of a key written at `at` starts, if the text there is shaped like one of
/// our keys (`as_`, 16 hex digits, `_`, a hex digit).
fn key_secret_start(bytes: &[u8], at: usize) -> Option<usize> {
    let id = at + PREFIX.len();
    let secret = id + ID_BYTES * 2 + 1;
    let shaped = bytes.get(at..secret + 1)?;
    (shaped.starts_with(PREFIX.as_bytes())
        && bytes[id..secret - 1].iter().all(u8::is_ascii_hexdigit)
        && bytes[secret - 1] == b'_'
        && bytes[secret].is_ascii_hexdigit())
    .then_some(secret)
}

/// Where a token that starts at `at` ends: the characters of RFC 6750's `b64token`.
fn token_end(bytes: &[u8], at: usize) -> usize {
    at + bytes[at..]
        .iter()
        .take_while(|&&b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b))
        .count()
}

/// The first index from `at` whose byte is not one of `these`.
fn skip(bytes: &[u8], at: usize, these: &[u8]) -> usize {
    at + bytes
        .get(at..)
        .unwrap_or_default()
        .iter()
        .take_while(|b| these.contains(b))
        .count()
}

/// Where `needle` (lowercase) starts in `haystack`, in any case.
fn find_ignoring_case<'a>(
    haystack: &'a [u8],
    needle: &'a [u8],
) -> impl Iterator<Item = usize> + 'a {
    haystack
        .windows(needle.len())
        .enumerate()
        .filter(move |(_, w)| w.eq_ignore_ascii_case(needle))
        .map(|(at, _)| at)
}

/// `spans` sorted, with those that overlap or touch made one.
fn merge(mut spans: Vec<Range<usize>>) -> Vec<Range<usize>> {
    spans.sort_by_key(|span| span.start);
    let mut merged: Vec<Range<usize>> = Vec::with_capacity(spans.len());
    for span in spans {
        match merged.last_mut() {
            Some(last) if span.start <= last.end => last.end = last.end.max(span.end),
            _ => merged.push(span),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const KEY: &str =
        "as_4f33f576686a4e2b_9e57901afe89e3521151427c8258d26729c81e43d77954cabaef21a57d0b7d51";
    const SECRET: &str = "9e57901afe89e3521151427c8258d26729c81e43d77954cabaef21a57d0b7d51";

    /// Each line as pingora or a client may write it, and what the log gets.
    #[test]
    fn credentials_are_taken_out_wherever_they_stand() {
        let cases = [
            // pingora's debug line for a head it cannot parse (`escape_ascii` and `{:?}` forms).
            (
                format!(r"buf: GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n"),
                r"buf: GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer as_4f33f576686a4e2b_[redacted]\r\n\r\n".to_owned(),
            ),
            (
                format!(r#"buf: "GET / HTTP/1.1\r\nauthorization:bearer   {KEY}\r\n""#),
                r#"buf: "GET / HTTP/1.1\r\nauthorization:bearer   as_4f33f576686a4e2b_[redacted]\r\n""#.to_owned(),
            ),
            // A header map's `Debug`, with a scheme that is not ours.
            (
                r#"headers: {"authorization": "Basic dXNlcjpzZWNyZXQ=", "host": "x"}"#.to_owned(),
                r#"headers: {"authorization": "Basic [redacted]", "host": "x"}"#.to_owned(),
            ),
            // A credential without a scheme.
            (
                "Authorization: s3cr3t\r\n".to_owned(),
                "Authorization: [redacted]\r\n".to_owned(),
            ),
            // A token that is not one of our keys, of a field that is not `Authorization`.
            (
                "Proxy-Authorization: Bearer abc.DEF-123_x~y+z/w==; next\r\nHost: x".to_owned(),
                "Proxy-Authorization: Bearer [redacted]\r\nHost: x".to_owned(),
            ),
            // A key where no key belongs: a query string, a header of the client's own.
            (
                format!("uri: /v1/pets?api_key={KEY}&limit=5, x-api-key: {KEY}"),
                "uri: /v1/pets?api_key=as_4f33f576686a4e2b_[redacted]&limit=5, x-api-key: as_4f33f576686a4e2b_[redacted]".to_owned(),
            ),
            // A key cut short (pingora keeps 2 KiB of a head) is still a secret.
            (
                format!("...{}", &KEY[..30]),
                "...as_4f33f576686a4e2b_[redacted]".to_owned(),
            ),
        ];
        for (line, logged) in cases {
            assert_eq!(redact(&line), logged, "{line}");
            assert!(!redact(&line).contains(&SECRET[..8]), "{line}");
        }
    }

    /// The gateway's own lines, which name keys by id and headers in sentences, are left whole
    /// and not copied.
    #[test]
    fn lines_without_credentials_are_left_as_they_are() {
        for line in [
            "send one Authorization header, not several",
            "an API key is required: send `Authorization: Bearer <key>`",
            "key 4f33f576686a4e2b revoked; bearer tokens are checked in constant time",
            "redis: connected to the server at redis://:[redacted]@127.0.0.1:6379",
            "the path has as_ in it, as_123_456 and as_4f33f576686a4e2b_ too",
            "",
            "authorization",
        ] {
            assert!(
                matches!(redact(line), Cow::Borrowed(_)),
                "{line}: {}",
                redact(line)
            );
        }
    }

    /// Whatever the text, the result is valid text and no byte of the input's credentials
    /// survives; cuts fall on character boundaries.
    #[test]
    fn any_text_comes_out_whole() {
        let line = format!("é Authorization: Bearer ü{KEY} Bearer\tß{KEY}é authorization=äb");
        let out = redact(&line);
        assert!(!out.contains(&SECRET[..8]), "{out}");
        assert_eq!(
            out,
            "é Authorization: Bearer üas_4f33f576686a4e2b_[redacted] Bearer\tßas_4f33f576686a4e2b_[redacted]é authorization=äb"
        );
    }

    proptest! {
        /// Whatever stands around a key or a piece of one (pieces of heads, header maps,
        /// queries, other text), no eight characters of its secret are left.
        #[test]
        fn no_secret_survives_whatever_surrounds_it(
            before in "(authorization|Authorization: |bearer |\\r\\n|\"|=| |[ -~]|é){0,8}",
            after in "(\\r\\n|\"|&|,| |[ -~]|ß){0,8}",
            cut in 20usize..=KEY.len(),
        ) {
            let line = format!("{before}{}{after}", &KEY[..cut]);
            let out = redact(&line);
            for at in 0..SECRET.len() - 8 {
                prop_assert!(!out.contains(&SECRET[at..at + 8]), "{} -> {}", line, out);
            }
        }

        /// Text with neither a field's name nor a key's prefix comes back as it was, uncopied.
        #[test]
        fn other_text_is_left_alone(line in "([ -~]|é|\\r\\n){0,60}") {
            prop_assume!(!line.to_ascii_lowercase().contains("authorization"));
            prop_assume!(!line.contains(PREFIX));
            prop_assert!(matches!(redact(&line), Cow::Borrowed(text) if text == line));
        }
    }
}
