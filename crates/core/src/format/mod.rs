//! The checkpoint formats, parsed from bytes and never from files: the safetensors header, the sharded index, and the names a checkpoint gives them.

pub mod header;
pub(crate) mod index;

/// The file name of a single-file checkpoint in a directory (or under a remote prefix).
pub const SINGLE_FILE: &str = "model.safetensors";
/// The file name of a sharded checkpoint's index in a directory (or under a remote prefix).
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The largest index read: real ones are a few MiB; a hostile one must not allocate unbounded.
pub const MAX_INDEX_BYTES: u64 = 100_000_000;

/// The bytes a tensor of `dtype` and `shape` takes: `None` where the count overflows or does
/// not end on a byte boundary, which no valid header has.
pub(crate) fn byte_len(dtype: safetensors::Dtype, shape: &[usize]) -> Option<u64> {
    let bits = shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d as u64))?
        .checked_mul(dtype.bitsize() as u64)?;
    (bits % 8 == 0).then_some(bits / 8)
}

/// Whether `dtype` is a floating-point type (the F8, F6, F4 variants and C64 included).
pub(crate) fn is_float(dtype: safetensors::Dtype) -> bool {
    use safetensors::Dtype::*;
    matches!(
        dtype,
        F4 | F6_E2M3
            | F6_E3M2
            | F8_E5M2
            | F8_E4M3
            | F8_E8M0
            | F8_E4M3FNUZ
            | F8_E5M2FNUZ
            | F16
            | BF16
            | F32
            | F64
            | C64
    )
}

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
