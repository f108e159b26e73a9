//! The kernel's octal escapes in mount table fields: decoding them, and writing bytes that are not UTF-8 the same way so that a text parser can read the line.
//!
//! The kernel writes space, tab, newline and backslash inside a field as `\040`, `\011`,
//! `\012` and `\134` (`mangle()` in `fs/proc_namespace.c`); every other byte, including bytes
//! that are not UTF-8, is written as it is.

use std::borrow::Cow;
use std::path::PathBuf;

/// Decodes `\ooo` octal escapes. A backslash not followed by three octal digits of a byte
/// value is kept as it is, and one level is decoded (`\134040` is `\040`).
pub(super) fn decode(field: &[u8]) -> Cow<'_, [u8]> {
    if !field.contains(&b'\\') {
        return Cow::Borrowed(field);
    }
    let mut decoded = Vec::with_capacity(field.len());
    let mut rest = field;
    while let Some((&byte, tail)) = rest.split_first() {
        if byte == b'\\' {
            if let Some(value) = tail.get(..3).and_then(octal_byte) {
                decoded.push(value);
                rest = tail.get(3..).unwrap_or_default();
                continue;
            }
        }
        decoded.push(byte);
        rest = tail;
    }
    Cow::Owned(decoded)
}

fn octal_byte(digits: &[u8]) -> Option<u8> {
    let value = digits.iter().try_fold(0u32, |value, &digit| {
        (b'0'..=b'7')
            .contains(&digit)
            .then(|| value * 8 + u32::from(digit - b'0'))
    })?;
    u8::try_from(value).ok()
}

/// [`decode`] for text, such as an option value; bytes that are not UTF-8 become U+FFFD.
pub(super) fn decode_str(field: &str) -> Cow<'_, str> {
    match decode(field.as_bytes()) {
        Cow::Borrowed(_) => Cow::Borrowed(field),
        Cow::Owned(bytes) => Cow::Owned(String::from_utf8_lossy(&bytes).into_owned()),
    }
}

/// A decoded field as text (type, source): bytes that are not UTF-8 become U+FFFD.
pub(super) fn decoded_string(field: &[u8]) -> String {
    String::from_utf8_lossy(&decode(field)).into_owned()
}

/// A decoded field as a path (root, mount point): kept exactly on Unix.
pub(super) fn decoded_path(field: &[u8]) -> PathBuf {
    crate::os::path_from_bytes(decode(field).into_owned())
}

/// `line` as text for a parser that takes `&str` (procfs): each byte that is not UTF-8 is
/// written as the kernel would escape it (`\377`). Nothing is lost to [`decode`]: an inserted
/// escape can neither finish one begun before it nor be joined by what follows (exactly three
/// digits), and no space moves.
pub(super) fn to_text(line: &[u8]) -> Cow<'_, str> {
    if let Ok(text) = std::str::from_utf8(line) {
        return Cow::Borrowed(text);
    }
    let mut text = String::with_capacity(line.len() + 8);
    for chunk in line.utf8_chunks() {
        text.push_str(chunk.valid());
        for byte in chunk.invalid() {
            text.push_str(&format!("\\{byte:03o}"));
        }
    }
    Cow::Owned(text)
}

#[cfg(test)]
#[cfg_attr(test, allow(clippy::unwrap_used, clippy::indexing_slicing))]
mod tests {
    use super::*;
    use crate::mount::test_util::escape_field;
    use proptest::prelude::*;

    #[test]
    fn escapes_decode_and_malformed_ones_stay_literal() {
        let decode = |s: &str| decode(s.as_bytes()).into_owned();
        assert_eq!(decode("plain"), b"plain");
        assert_eq!(decode("a\\040b"), b"a b");
        assert_eq!(decode("\\134040"), b"\\040"); // one level of decoding only
        assert_eq!(decode("\\303\\251"), "é".as_bytes());
        assert_eq!(decode("\\377"), [0xFF]);
        assert_eq!(decode("a\\9b"), b"a\\9b");
        assert_eq!(decode("a\\04"), b"a\\04");
        assert_eq!(decode("a\\400"), b"a\\400"); // 256 is not a byte
        assert_eq!(decode("a\\"), b"a\\");
        assert_eq!(decode("\\\\040"), b"\\ ");
        assert!(matches!(super::decode(b"no escapes"), Cow::Borrowed(_)));
    }

    #[test]
    fn escaping_then_decoding_returns_every_byte() {
        // The naive twin: every byte, escaped the kernel's way, decodes back to itself.
        let all: Vec<u8> = (1..=255u8).collect();
        assert_eq!(decode(escape_field(&all).as_bytes()).into_owned(), all);
        for byte in 0..=255u8 {
            let field = [b'/', byte, b'x'];
            assert_eq!(decode(escape_field(&field).as_bytes()).into_owned(), field);
        }
    }

    #[test]
    fn text_for_procfs_keeps_utf8_and_escapes_the_rest() {
        assert!(matches!(
            to_text("/mnt/modèles".as_bytes()),
            Cow::Borrowed(_)
        ));
        assert_eq!(to_text(b"/mnt/\xff\xfe x"), "/mnt/\\377\\376 x");
        // A backslash before an escaped byte stays a lone backslash after decoding.
        assert_eq!(
            decode(to_text(b"a\\\xff").as_bytes()).into_owned(),
            b"a\\\xff"
        );
    }

    proptest! {
        // Whatever the line, decoding a field of its text gives what decoding the field
        // itself gives, and the text has the same fields.
        #[test]
        fn text_for_procfs_loses_nothing(
            line in proptest::collection::vec(
                prop_oneof![Just(b'\\'), Just(b' '), b'0'..=b'8', any::<u8>()],
                0..40,
            )
        ) {
            let text = to_text(&line);
            prop_assert_eq!(text.split(' ').count(), line.split(|&b| b == b' ').count());
            for (field, text_field) in line.split(|&b| b == b' ').zip(text.split(' ')) {
                prop_assert_eq!(decode(text_field.as_bytes()), decode(field));
            }
        }
    }
}
