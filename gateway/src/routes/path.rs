//! The one form of a request's path that routing, limits, deprecation and forwarding all use,
//! [`normalize_path`], or why a path has none: percent-encoded unreserved characters are
//! decoded (`%70ets` is `pets`), and anything that different servers could read differently
//! (dot-segments, encoded `/` or `\`, NUL, empty segments, broken escapes) is refused.

use std::borrow::Cow;

/// Why a path was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    /// Not an absolute path (`*`, an absolute URI, empty).
    NotAbsolute,
    /// `.` or `..` as a segment, literally or percent-encoded.
    DotSegment,
    /// `%2F`, `%5C` or a literal backslash: a separator in disguise.
    EncodedSeparator,
    /// NUL, literally or as `%00`, or another control character.
    ControlCharacter,
    /// `//`: an empty segment.
    EmptySegment,
    /// `%` not followed by two hex digits.
    BadEscape,
}

impl PathError {
    /// A sentence for the error body.
    pub fn message(self) -> &'static str {
        match self {
            PathError::NotAbsolute => "the request target must be an absolute path",
            PathError::DotSegment => "the path must not contain `.` or `..` segments",
            PathError::EncodedSeparator => {
                "the path must not contain encoded `/` or `\\`, or a backslash"
            }
            PathError::ControlCharacter => "the path must not contain NUL or control characters",
            PathError::EmptySegment => "the path must not contain empty segments (`//`)",
            PathError::BadEscape => "the path contains a malformed percent-escape",
        }
    }
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex_value(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// The one form of `path` that the gateway decides on and forwards, or why there is none.
pub fn normalize_path(path: &str) -> Result<Cow<'_, str>, PathError> {
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    let mut out: Option<Vec<u8>> = None;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let (decoded, width) = if b == b'%' {
            let hi = bytes.get(i + 1).copied().and_then(hex_value);
            let lo = bytes.get(i + 2).copied().and_then(hex_value);
            let (Some(hi), Some(lo)) = (hi, lo) else {
                return Err(PathError::BadEscape);
            };
            (Some(hi * 16 + lo), 3)
        } else {
            (None, 1)
        };
        match decoded {
            Some(b'/' | b'\\') => return Err(PathError::EncodedSeparator),
            Some(c) if c.is_ascii_control() => return Err(PathError::ControlCharacter),
            Some(c) if is_unreserved(c) => {
                out.get_or_insert_with(|| bytes[..i].to_vec()).push(c);
            }
            Some(_) => {
                if let Some(out) = out.as_mut() {
                    out.extend_from_slice(&bytes[i..i + 3]);
                }
            }
            None if b == b'\\' => return Err(PathError::EncodedSeparator),
            None if b.is_ascii_control() => return Err(PathError::ControlCharacter),
            None => {
                if let Some(out) = out.as_mut() {
                    out.push(b);
                }
            }
        }
        i += width;
    }
    let normalized = match out {
        // Only ASCII was decoded into `out`, and the rest is copied from a `str`.
        Some(out) => Cow::Owned(String::from_utf8(out).map_err(|_| PathError::BadEscape)?),
        None => Cow::Borrowed(path),
    };
    check_segments(normalized.as_bytes())?;
    Ok(normalized)
}

/// Refuses an empty segment (`//`), and then a `.` or `..` segment, of an absolute path: one
/// pass over its bytes, which every request pays (a substring search and a split cost five times
/// as much).
pub(super) fn check_segments(path: &[u8]) -> Result<(), PathError> {
    let (mut empty, mut dot) = (false, false);
    let mut start = 1; // the first segment begins after the leading `/`
    for end in 1..=path.len() {
        if end == path.len() || path[end] == b'/' {
            let segment = &path[start..end];
            // A last segment may be empty: `/v1/pets/`.
            empty |= segment.is_empty() && end < path.len();
            dot |= segment == b"." || segment == b"..";
            start = end + 1;
        }
    }
    if empty {
        Err(PathError::EmptySegment)
    } else if dot {
        Err(PathError::DotSegment)
    } else {
        Ok(())
    }
}
