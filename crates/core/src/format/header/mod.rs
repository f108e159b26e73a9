//! The safetensors header: its length prefix, and its JSON parsed into checked tensor entries by the `safetensors` crate's rules.
//!
//! Pure: it takes bytes and never opens a file (`entry` reads the JSON in one pass, `fuzz`
//! is the fuzz crate's way in).

use std::collections::{BTreeMap, HashSet};

use safetensors::Dtype;

use crate::error::ErrorKind;

use entry::{Entries, Entry};

mod entry;
pub mod fuzz;
#[cfg(test)]
mod tests;

/// The largest header accepted, in bytes; the same limit as the `safetensors`
/// crate, checked here before anything is allocated.
pub const MAX_HEADER_LEN: u64 = 100_000_000;
/// Bytes of the little-endian header-length prefix.
pub const PREFIX_LEN: u64 = 8;
/// The deepest nesting of JSON arrays and objects a header may have (the outer object is the
/// first level): serde_json's recursion limit, which the reference and [`entry::Skip`] apply.
pub(crate) const MAX_NESTING: usize = 127;

/// One tensor as the header describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Byte range relative to the start of the data section.
    pub start: u64,
    pub end: u64,
}

/// A parsed, checked header.
#[derive(Debug, Clone)]
pub struct Header {
    /// Where the data section starts in the file (8 + header length).
    pub data_start: u64,
    /// Tensors in file order: by offset, ties (empty tensors) by name.
    pub tensors: Vec<TensorEntry>,
    /// The `__metadata__` object.
    pub metadata: Option<BTreeMap<String, String>>,
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

/// Parses the header's JSON (the bytes after the prefix) and checks it describes a file of
/// exactly `file_len` bytes, by the `safetensors` crate's rules (see `check`), no name twice.
///
/// NOTE: not through the crate's `Metadata`, whose serde `flatten` buffers the whole header
/// into a tree: on a big header that cost more than the rest of the load (BENCHMARKS.md, "Big
/// headers"). The property tests, the fuzz target and the reference-verdict tests hold the two
/// parsers to the same verdict.
pub(crate) fn parse(json: &[u8], file_len: u64) -> Result<Header, ErrorKind> {
    let invalid = |reason: String| ErrorKind::InvalidHeader { reason };
    let text = std::str::from_utf8(json).map_err(|e| invalid(format!("not UTF-8: {e}")))?;
    let Entries {
        metadata,
        mut tensors,
    } = serde_json::from_str(text).map_err(|e| invalid(json_reason(&e)))?;
    // Empty tensors share offsets: ties go by name, so the first fault named is stable.
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

/// Why JSON that does not parse is refused: serde_json's message, or the nesting limit's.
fn json_reason(e: &serde_json::Error) -> String {
    let message = e.to_string();
    // serde_json has no error code for it: its message's start (no header text can appear
    // there) is matched; a reworded release fails `nesting_limit_is_the_references`.
    if e.is_syntax() && message.starts_with("recursion limit exceeded") {
        return format!(
            "nesting limit exceeded: more than {MAX_NESTING} levels of arrays and objects, at \
             line {} column {} (serde_json's recursion limit, under which the safetensors crate \
             parses headers)",
            e.line(),
            e.column()
        );
    }
    message
}

/// The `safetensors` crate's rules (offsets contiguous from 0, each tensor's length its
/// shape's, checked arithmetic) in offset order, so the first entry that breaks one is named.
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

/// Parses a whole safetensors file held in memory (the tests, [`fuzz::parse_file`]).
pub(crate) fn parse_file(bytes: &[u8]) -> Result<Header, ErrorKind> {
    let file_len = bytes.len() as u64;
    let len = header_len(bytes, file_len)?;
    let json = usize::try_from(len)
        .ok()
        .and_then(|len| bytes.get(8..8 + len))
        .ok_or(ErrorKind::HeaderOutOfBounds { len, file_len })?;
    parse(json, file_len)
}

/// The alignment a typed view of `dtype` needs: its size, at most 8; 1 for sub-byte types.
pub(crate) fn dtype_align(dtype: Dtype) -> u64 {
    ((dtype.bitsize() / 8).clamp(1, 8)) as u64
}
