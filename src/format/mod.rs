//! The file formats, parsed from bytes and never from files: the safetensors header and the sharded index.
//!
//! Pure, so that every check is exercised by unit tests, property tests and
//! the fuzz targets alike; `checkpoint` and `load` do the I/O around it.

pub(crate) mod header;
pub(crate) mod index;

/// Every dtype of safetensors 0.8: 1-, 2-, 4- and 8-byte elements, BOOL,
/// and the packed 4- and 6-bit types; for the unit tests that go through
/// them all.
#[cfg(test)]
pub(crate) const ALL_DTYPES: [safetensors::Dtype; 22] = {
    use safetensors::Dtype::*;
    [
        BOOL,
        F4,
        F6_E2M3,
        F6_E3M2,
        U8,
        I8,
        F8_E5M2,
        F8_E4M3,
        F8_E8M0,
        F8_E4M3FNUZ,
        F8_E5M2FNUZ,
        I16,
        U16,
        F16,
        BF16,
        I32,
        U32,
        F32,
        C64,
        F64,
        I64,
        U64,
    ]
};
