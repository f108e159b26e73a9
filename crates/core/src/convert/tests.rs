//! Tests of the conversion core: known values (`values`), the fast path
//! against its naive twin (`twin`, `reference`), copies and errors (here).

mod reference;
mod twin;
mod values;

use crate::format::ALL_DTYPES;
use safetensors::Dtype;

use super::*;

/// The conversions of the module's table (every one but the copies).
const PAIRS: [(Dtype, Dtype); 18] = {
    use Dtype::*;
    [
        (F64, F32),
        (F64, F16),
        (F64, BF16),
        (F32, F16),
        (F32, BF16),
        (F16, F32),
        (F16, BF16),
        (BF16, F32),
        (BF16, F16),
        (F8_E4M3, F32),
        (F8_E4M3, F16),
        (F8_E4M3, BF16),
        (F8_E5M2, F32),
        (F8_E5M2, F16),
        (F8_E5M2, BF16),
        // The conversions `is_supported` also accepts as copies.
        (F32, F32),
        (F16, F16),
        (BF16, BF16),
    ]
};

/// Bytes per element.
fn size(dtype: Dtype) -> usize {
    dtype.bitsize() / 8
}

/// Little-endian bytes of `bits`, `size(dtype)` bytes each.
fn to_bytes(dtype: Dtype, bits: &[u64]) -> Vec<u8> {
    bits.iter()
        .flat_map(|b| b.to_le_bytes().into_iter().take(size(dtype)))
        .collect()
}

/// The elements of little-endian `bytes` as bits.
fn from_bytes(dtype: Dtype, bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(size(dtype))
        .map(|chunk| {
            let mut full = [0u8; 8];
            full[..chunk.len()].copy_from_slice(chunk);
            u64::from_le_bytes(full)
        })
        .collect()
}

/// Runs [`convert`] on `bits` placed `src_offset` bytes into an 8-aligned
/// buffer, into a destination `dst_offset` bytes into another, and returns
/// the converted bits and the overflow count.
fn fast(
    from: Dtype,
    to: Dtype,
    bits: &[u64],
    src_offset: usize,
    dst_offset: usize,
) -> (Vec<u64>, u64) {
    let src_bytes = to_bytes(from, bits);
    let dst_len = bits.len() * size(to);
    let mut src_buf = vec![0u64; (src_offset + src_bytes.len()).div_ceil(8)];
    let mut dst_buf = vec![0u64; (dst_offset + dst_len).div_ceil(8)];
    let src =
        &mut bytemuck::cast_slice_mut::<u64, u8>(&mut src_buf)[src_offset..][..src_bytes.len()];
    src.copy_from_slice(&src_bytes);
    let dst = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut dst_buf)[dst_offset..][..dst_len];
    let converted = convert(from, to, src, dst).unwrap();
    (from_bytes(to, dst), converted.overflowed())
}

fn length_mismatch(err: &Error) -> (u64, u64) {
    match err.kind() {
        ErrorKind::LengthMismatch {
            tensor,
            expected,
            actual,
        } => {
            assert_eq!(*tensor, None);
            (*expected, *actual)
        }
        other => panic!("expected LengthMismatch, got {other:?}"),
    }
}

#[test]
fn every_dtype_converts_to_itself_as_a_copy() {
    for dtype in ALL_DTYPES {
        assert!(is_supported(dtype, dtype), "{dtype}");
        let src: Vec<u8> = (0..25u8).map(|i| i.wrapping_mul(37)).collect();
        let mut dst = vec![0xAA; src.len()];
        let converted = convert(dtype, dtype, &src[1..], &mut dst[1..]).unwrap();
        assert_eq!(dst[1..], src[1..], "{dtype}");
        assert_eq!(converted.overflowed(), 0);
    }
}

#[test]
fn supported_pairs_are_the_table_and_the_copies() {
    for from in ALL_DTYPES {
        for to in ALL_DTYPES {
            let expected = from == to || PAIRS.contains(&(from, to));
            assert_eq!(is_supported(from, to), expected, "{from} -> {to}");
        }
    }
}

#[test]
fn unsupported_pairs_are_a_typed_error() {
    let cases = [
        (Dtype::F32, Dtype::F64),
        (Dtype::F16, Dtype::F8_E4M3),
        (Dtype::I32, Dtype::F32),
        (Dtype::F32, Dtype::I32),
        (Dtype::F8_E4M3FNUZ, Dtype::F16),
        (Dtype::U8, Dtype::BF16),
    ];
    for (from, to) in cases {
        let err = convert(from, to, &[0; 8], &mut [0; 8]).unwrap_err();
        assert_eq!(
            err.kind(),
            &ErrorKind::UnsupportedConversion {
                tensor: None,
                from,
                to
            }
        );
        assert_eq!(err.path(), None);
        assert_eq!(err.to_string(), format!("cannot convert {from} to {to}"));
    }
}

#[test]
fn a_destination_of_the_wrong_length_is_a_typed_error() {
    // 3 BF16 elements need 6 bytes of F16, 12 of F32.
    let src = [0u8; 6];
    for (to, len, expected) in [
        (Dtype::F16, 5, 6),
        (Dtype::F16, 7, 6),
        (Dtype::F32, 6, 12),
        (Dtype::F32, 0, 12),
    ] {
        let mut dst = vec![0u8; len];
        let err = convert(Dtype::BF16, to, &src, &mut dst).unwrap_err();
        assert_eq!(
            length_mismatch(&err),
            (expected, len as u64),
            "{to} into {len}"
        );
    }
    let err = convert(Dtype::F32, Dtype::F32, &[0; 8], &mut [0; 4]).unwrap_err();
    assert_eq!(length_mismatch(&err), (8, 4));
    assert_eq!(
        err.to_string(),
        "buffer of 4 bytes given where 8 are needed"
    );
}

#[test]
fn a_source_of_partial_elements_is_a_typed_error() {
    // The expected length is the next whole number of elements.
    let cases = [
        (Dtype::F32, Dtype::F16, 7, 8),
        (Dtype::F64, Dtype::BF16, 9, 16),
        (Dtype::F16, Dtype::F32, 1, 2),
        (Dtype::BF16, Dtype::BF16, 3, 4),
        (Dtype::I64, Dtype::I64, 12, 16),
    ];
    for (from, to, len, expected) in cases {
        let src = vec![0u8; len];
        // The destination may have any length: the source is checked first.
        let err = convert(from, to, &src, &mut [0; 64]).unwrap_err();
        assert_eq!(
            length_mismatch(&err),
            (expected, len as u64),
            "{from} -> {to}"
        );
    }
}

#[test]
fn empty_buffers_convert_to_nothing() {
    for (from, to) in PAIRS {
        assert_eq!(
            convert(from, to, &[], &mut []).unwrap(),
            Converted::default()
        );
    }
}

#[test]
fn public_types_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Converted>();
}
