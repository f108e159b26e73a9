//! The safetensors header: its length prefix, and its JSON parsed by the `safetensors` crate into checked tensor entries.
//!
//! Pure: everything here takes bytes and never opens a file, so every check is
//! exercised by unit tests, property tests and the fuzz targets alike.

use std::collections::HashMap;

use safetensors::Dtype;
use safetensors::tensor::{Metadata, TensorInfo};
use serde::Deserialize;

use crate::error::ErrorKind;
use crate::format::index::UniqueKeys;

/// The largest header accepted, in bytes; the same limit as the `safetensors`
/// crate, checked here before anything is allocated.
pub const MAX_HEADER_LEN: u64 = 100_000_000;
/// Bytes of the little-endian header-length prefix.
pub const PREFIX_LEN: u64 = 8;

/// One tensor as the header describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TensorEntry {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Byte range relative to the start of the data section.
    pub start: u64,
    pub end: u64,
}

/// A parsed, checked header.
#[derive(Debug, Clone)]
pub(crate) struct Header {
    /// Where the data section starts in the file (8 + header length).
    pub data_start: u64,
    /// Tensors in file order: by offset, ties (empty tensors) by name.
    pub tensors: Vec<TensorEntry>,
    /// The `__metadata__` object.
    pub metadata: Option<HashMap<String, String>>,
}

impl TensorEntry {
    /// The number of elements (1 for a scalar); `None` past `usize`, which
    /// a checked header never has.
    pub fn num_elements(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }
}

impl Header {
    /// The file length this header implies.
    pub fn file_len(&self) -> u64 {
        self.data_start + self.tensors.last().map_or(0, |t| t.end)
    }
}

/// Reads the header length from the first 8 bytes and checks it against the
/// limit and the file's length, before anything of that length is allocated.
pub(crate) fn header_len(prefix: &[u8], file_len: u64) -> Result<u64, ErrorKind> {
    let Some(bytes) = prefix.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) else {
        return Err(ErrorKind::FileTooSmall { len: file_len });
    };
    let len = u64::from_le_bytes(bytes);
    if len > MAX_HEADER_LEN {
        return Err(ErrorKind::HeaderTooLarge {
            len,
            limit: MAX_HEADER_LEN,
        });
    }
    if len > file_len.saturating_sub(PREFIX_LEN) {
        return Err(ErrorKind::HeaderOutOfBounds { len, file_len });
    }
    Ok(len)
}

/// Parses the header's JSON (the bytes after the 8-byte prefix) with the
/// `safetensors` crate, and checks it describes a file of exactly `file_len`
/// bytes.
pub(crate) fn parse(json: &[u8], file_len: u64) -> Result<Header, ErrorKind> {
    let invalid = |reason: String| ErrorKind::InvalidHeader { reason };
    let text = std::str::from_utf8(json).map_err(|e| invalid(format!("not UTF-8: {e}")))?;
    // The safetensors parser collects entries into a map, so a name written
    // twice would silently keep one entry; refuse that first.
    serde_json::from_str::<UniqueKeys>(text).map_err(|e| invalid(e.to_string()))?;
    // `Metadata`'s deserializer validates dtypes, shapes, contiguous offsets and
    // byte lengths with checked arithmetic.
    let metadata: Metadata = serde_json::from_str(text).map_err(|e| invalid(explain(text, e)))?;

    let data_start = PREFIX_LEN + json.len() as u64;
    let mut tensors = Vec::new();
    for name in metadata.offset_keys() {
        let Some(info) = metadata.info(&name) else {
            continue;
        };
        let (start, end) = info.data_offsets;
        tensors.push(TensorEntry {
            dtype: info.dtype,
            shape: info.shape.clone(),
            start: start as u64,
            end: end as u64,
            name,
        });
    }
    // Empty tensors share offsets with their neighbours, and the parser's
    // order among equal offsets comes from a hash map: break ties by name so
    // the order is the same on every run.
    tensors.sort_by(|a, b| (a.start, a.end, &a.name).cmp(&(b.start, b.end, &b.name)));
    let header = Header {
        data_start,
        tensors,
        metadata: metadata.metadata().clone(),
    };
    let expected = header.file_len();
    if expected != file_len {
        return Err(ErrorKind::SizeMismatch {
            expected,
            actual: file_len,
        });
    }
    Ok(header)
}

/// The reason for a header the `safetensors` parser refused, made
/// deterministic: that parser orders tensors through a hash map, so when
/// several entries are wrong the one it names varies from run to run. Here
/// the entries are checked in a fixed order (by offsets, then name), with
/// the same rules, and the first that breaks one is named.
fn explain(text: &str, error: serde_json::Error) -> String {
    let message = error.to_string();
    let Ok(entries) =
        serde_json::from_str::<std::collections::BTreeMap<String, serde_json::Value>>(text)
    else {
        return message;
    };
    let mut tensors: Vec<(String, TensorInfo)> = Vec::new();
    for (name, value) in entries {
        if name == "__metadata__" {
            continue;
        }
        match TensorInfo::deserialize(&value) {
            Ok(info) => tensors.push((name, info)),
            // An entry that does not parse: the parser's message names no
            // tensor, so it is the same on every run.
            Err(_) => return message,
        }
    }
    tensors.sort_by(|(a, x), (b, y)| (x.data_offsets, a).cmp(&(y.data_offsets, b)));
    let mut end = 0usize;
    for (name, info) in &tensors {
        let (start, stop) = info.data_offsets;
        if start != end || stop < start {
            return format!(
                "invalid offset for tensor {name:?}: data_offsets [{start}, {stop}], expected to start at \
                 {end} (tensors must be contiguous, in order, without gaps or overlaps)"
            );
        }
        end = stop;
        let bits = info
            .shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .and_then(|n| n.checked_mul(info.dtype.bitsize()));
        let Some(bits) = bits else {
            return format!(
                "overflow computing buffer size from shape and/or element type: tensor {name:?} of shape {:?}",
                info.shape
            );
        };
        if bits % 8 != 0 {
            return format!(
                "tensor {name:?} of {} elements of {} does not end on a byte boundary",
                bits / info.dtype.bitsize().max(1),
                info.dtype
            );
        }
        if stop - start != bits / 8 {
            return format!(
                "invalid shape, data type, or offset for tensor {name:?}: dtype {} and shape {:?} need {} \
                 bytes, its data_offsets give {}",
                info.dtype,
                info.shape,
                bits / 8,
                stop - start
            );
        }
    }
    message
}

/// Parses a whole safetensors file held in memory. Pure; used by tests and
/// the fuzz targets.
#[cfg(test)]
pub(crate) fn parse_file(bytes: &[u8]) -> Result<Header, ErrorKind> {
    let file_len = bytes.len() as u64;
    let len = header_len(bytes, file_len)?;
    let json = usize::try_from(len)
        .ok()
        .and_then(|len| bytes.get(8..8 + len))
        .ok_or(ErrorKind::HeaderOutOfBounds { len, file_len })?;
    parse(json, file_len)
}

/// The alignment a dtype's elements need for a typed view: their size in
/// bytes, at most 8; sub-byte types need none.
pub(crate) fn dtype_align(dtype: Dtype) -> u64 {
    ((dtype.bitsize() / 8).clamp(1, 8)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
