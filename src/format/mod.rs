//! The file formats, parsed from bytes and never from files: the safetensors header and the sharded index.
//!
//! Pure, so that every check is exercised by unit tests, property tests and
//! the fuzz targets alike; `checkpoint` and `load` do the I/O around it.

pub(crate) mod header;
pub(crate) mod index;
