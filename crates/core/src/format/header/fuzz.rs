//! The fuzz crate's way in to the header parser: a whole file's bytes in, the verdict and the tensors out as plain types; hidden, not part of the API.
//!
//! `safeload::__fuzz`, for the `header_parse` fuzz target: the functions a load calls,
//! with no file, thread or `/proc` read per input.

use std::collections::HashMap;

use safetensors::Dtype;

use crate::error::ErrorKind;

/// A header the parser accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedHeader {
    /// Where the data section starts in the file: 8 + the header's length.
    pub data_start: u64,
    /// The tensors in file order: by offsets, ties (empty tensors) by name.
    pub tensors: Vec<ParsedTensor>,
    /// The `__metadata__` object, if the header has one that is not `null`.
    pub metadata: Option<HashMap<String, String>>,
}

/// One tensor of an accepted header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedTensor {
    /// The tensor's name, its key in the header.
    pub name: String,
    /// Its element type.
    pub dtype: Dtype,
    /// Its shape; empty for a scalar.
    pub shape: Vec<usize>,
    /// Its `data_offsets`: the byte range, relative to the start of the data
    /// section, as the header gives it.
    pub data_offsets: (u64, u64),
}

/// Parses the bytes of a whole `.safetensors` file as a load parses them.
///
/// # Errors
///
/// The [`ErrorKind`] a load of the same bytes fails with, when the header
/// is refused.
pub fn parse_file(file: &[u8]) -> Result<ParsedHeader, ErrorKind> {
    let header = super::parse_file(file)?;
    Ok(ParsedHeader {
        data_start: header.data_start,
        tensors: header
            .tensors
            .into_iter()
            .map(|t| ParsedTensor {
                name: t.name,
                dtype: t.dtype,
                shape: t.shape,
                data_offsets: (t.start, t.end),
            })
            .collect(),
        metadata: header.metadata.map(|m| m.into_iter().collect()),
    })
}
