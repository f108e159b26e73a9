//! Unit tests of the length prefix, the entry order and the checks, and the file builder the reference-verdict tests share.

use super::*;

mod reference_verdicts;

/// A file: the 8-byte length of `header`, `header`, `data` zero bytes.
fn file(header: &str, data: usize) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + data, 0);
    bytes
}

#[test]
fn length_prefix_checked_before_allocation() {
    assert_eq!(
        header_len(&[1, 2], 2),
        Err(ErrorKind::FileTooSmall { len: 2 })
    );
    assert!(matches!(
        header_len(&u64::MAX.to_le_bytes(), 100),
        Err(ErrorKind::HeaderTooLarge { .. })
    ));
    assert_eq!(
        header_len(&100u64.to_le_bytes(), 50),
        Err(ErrorKind::HeaderOutOfBounds {
            len: 100,
            file_len: 50
        })
    );
    assert_eq!(header_len(&42u64.to_le_bytes(), 50), Ok(42));
}

#[test]
fn entries_in_offset_order() {
    let bytes = file(
        r#"{"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"__metadata__":{"format":"pt"}}"#,
        12,
    );
    let header = parse_file(&bytes).unwrap();
    let names: Vec<_> = header.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(header.tensors[1].start, 4);
    assert_eq!(header.metadata.unwrap()["format"], "pt");
}

#[test]
fn duplicates_truncation_and_trailing_bytes() {
    let dup = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
    assert!(matches!(
        parse_file(&file(dup, 1)),
        Err(ErrorKind::InvalidHeader { .. })
    ));
    let one = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#;
    assert!(matches!(
        parse_file(&file(one, 1)),
        Err(ErrorKind::SizeMismatch { expected, actual }) if expected > actual
    ));
    assert!(matches!(
        parse_file(&file(one, 3)),
        Err(ErrorKind::SizeMismatch { expected, actual }) if expected < actual
    ));
}
