//! The safetensors header: its length prefix, and its JSON parsed into checked tensor entries by the `safetensors` crate's rules.
//!
//! Pure: everything here takes bytes and never opens a file, so every check is
//! exercised by unit tests, property tests and the fuzz targets alike.

use std::collections::{HashMap, HashSet};
use std::fmt;

use safetensors::Dtype;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::error::ErrorKind;

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

/// Parses the header's JSON (the bytes after the 8-byte prefix) and checks
/// it describes a file of exactly `file_len` bytes: every entry by the rules
/// of the `safetensors` crate (a known dtype, offsets contiguous from 0 in
/// order, each tensor's byte length its shape's, all with checked
/// arithmetic), no name twice, nothing after the last tensor.
///
/// NOTE: the entries are read with the crate's own `Dtype` deserializer,
/// but not through its `Metadata`, whose deserializer goes
/// through serde's `flatten`: that buffers the whole header into a
/// generic tree before building a hash map from it. On a 1.35 M-tensor,
/// 94 MB header that cost more time and memory than the rest of the load
/// (BENCHMARKS.md, "Big headers"); one pass into a vector, one sort by
/// offset and a set of names for duplicates does the same checks. The
/// property tests and the fuzz target hold the two parsers to the same
/// verdict on damaged files.
pub(crate) fn parse(json: &[u8], file_len: u64) -> Result<Header, ErrorKind> {
    let invalid = |reason: String| ErrorKind::InvalidHeader { reason };
    let text = std::str::from_utf8(json).map_err(|e| invalid(format!("not UTF-8: {e}")))?;
    let Entries {
        metadata,
        mut tensors,
    } = serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
    // File order: by offsets; empty tensors share offsets with their
    // neighbours, so ties go by name and the order (and the first fault
    // named) is the same on every run.
    tensors.sort_unstable_by(|(a, x), (b, y)| (x.data_offsets, a).cmp(&(y.data_offsets, b)));
    let mut names = HashSet::with_capacity(tensors.len());
    for (name, _) in &tensors {
        if !names.insert(name.as_str()) {
            return Err(invalid(format!("tensor {name:?} appears twice")));
        }
    }
    drop(names);
    check(&tensors).map_err(invalid)?;

    let data_start = PREFIX_LEN + json.len() as u64;
    let tensors: Vec<TensorEntry> = tensors
        .into_iter()
        .map(|(name, info)| TensorEntry {
            name,
            dtype: info.dtype,
            shape: info.shape,
            start: info.data_offsets.0 as u64,
            end: info.data_offsets.1 as u64,
        })
        .collect();
    let header = Header {
        data_start,
        tensors,
        metadata,
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

/// The header's entries in the order the JSON gives them.
struct Entries {
    metadata: Option<HashMap<String, String>>,
    tensors: Vec<(String, Entry)>,
}

/// One tensor's entry: the fields of the crate's `TensorInfo`, read so that
/// a wrong dtype or offset pair says what it is (serde_json's direct enum
/// and tuple errors say only "expected value" or "trailing characters").
/// Unknown fields are ignored, as the crate ignores them.
#[derive(Deserialize)]
struct Entry {
    #[serde(deserialize_with = "dtype")]
    dtype: Dtype,
    shape: Vec<usize>,
    #[serde(deserialize_with = "offsets")]
    data_offsets: (usize, usize),
}

/// A dtype by its name, through the crate's own `Dtype` deserializer.
fn dtype<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Dtype, D::Error> {
    struct Name;
    impl Visitor<'_> for Name {
        type Value = Dtype;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a dtype name such as \"F32\"")
        }
        fn visit_str<E: de::Error>(self, name: &str) -> Result<Dtype, E> {
            Dtype::deserialize(de::value::StrDeserializer::<E>::new(name))
        }
    }
    deserializer.deserialize_str(Name)
}

/// `data_offsets`: exactly two numbers.
fn offsets<'de, D: Deserializer<'de>>(deserializer: D) -> Result<(usize, usize), D::Error> {
    struct Pair;
    impl<'de> Visitor<'de> for Pair {
        type Value = (usize, usize);
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("two offsets")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(usize, usize), A::Error> {
            let start = seq
                .next_element()?
                .ok_or_else(|| de::Error::invalid_length(0, &self))?;
            let end = seq
                .next_element()?
                .ok_or_else(|| de::Error::invalid_length(1, &self))?;
            let mut extra = 0;
            while seq.next_element::<de::IgnoredAny>()?.is_some() {
                extra += 1;
            }
            if extra > 0 {
                return Err(de::Error::invalid_length(2 + extra, &self));
            }
            Ok((start, end))
        }
    }
    deserializer.deserialize_seq(Pair)
}

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntriesVisitor;
        impl<'de> Visitor<'de> for EntriesVisitor {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object of tensor entries")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut metadata = None;
                let mut seen_metadata = false;
                let mut tensors = Vec::new();
                while let Some(name) = map.next_key::<String>()? {
                    if name == "__metadata__" {
                        if seen_metadata {
                            return Err(de::Error::custom("\"__metadata__\" appears twice"));
                        }
                        seen_metadata = true;
                        metadata = map.next_value()?;
                    } else {
                        let info: Entry = map.next_value()?;
                        tensors.push((name, info));
                    }
                }
                Ok(Entries { metadata, tensors })
            }
        }
        deserializer.deserialize_map(EntriesVisitor)
    }
}

/// The `safetensors` crate's rules for entries in offset order, checked in
/// that order so that the first entry that breaks one is named.
fn check(tensors: &[(String, Entry)]) -> Result<(), String> {
    let mut end = 0usize;
    for (name, info) in tensors {
        let (start, stop) = info.data_offsets;
        if start != end || stop < start {
            return Err(format!(
                "invalid offset for tensor {name:?}: data_offsets [{start}, {stop}], expected to start at \
                 {end} (tensors must be contiguous, in order, without gaps or overlaps)"
            ));
        }
        end = stop;
        let bits = info
            .shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .and_then(|n| n.checked_mul(info.dtype.bitsize()));
        let Some(bits) = bits else {
            return Err(format!(
                "overflow computing buffer size from shape and/or element type: tensor {name:?} of shape {:?}",
                info.shape
            ));
        };
        if bits % 8 != 0 {
            return Err(format!(
                "tensor {name:?} of {} elements of {} does not end on a byte boundary",
                bits / info.dtype.bitsize().max(1),
                info.dtype
            ));
        }
        if stop - start != bits / 8 {
            return Err(format!(
                "invalid shape, data type, or offset for tensor {name:?}: dtype {} and shape {:?} need {} \
                 bytes, its data_offsets give {}",
                info.dtype,
                info.shape,
                bits / 8,
                stop - start
            ));
        }
    }
    Ok(())
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
