//! Converts tensor bytes from one floating-point dtype to another: bytes in, bytes out.
//!
//! [`convert`] reads little-endian elements from a byte slice (aligned or not) into a buffer
//! the caller owns; it allocates nothing and never panics, and counts the values that
//! overflowed to infinity.
//!
//! ```
//! use safeload::Dtype;
//! use safeload::convert::{convert, is_supported};
//!
//! // BF16 bits: 1.0, -0.0, 3.0e38 (beyond F16's 65504), +inf.
//! let src: Vec<u8> = [0x3F80u16, 0x8000, 0x7F62, 0x7F80]
//!     .iter()
//!     .flat_map(|h| h.to_le_bytes())
//!     .collect();
//! assert!(is_supported(Dtype::BF16, Dtype::F16));
//!
//! let mut dst = vec![0u8; 4 * 2]; // four F16 elements
//! let converted = convert(Dtype::BF16, Dtype::F16, &src, &mut dst)?;
//!
//! let f16_bits: Vec<u16> = dst.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
//! assert_eq!(f16_bits, [0x3C00, 0x8000, 0x7C00, 0x7C00]); // 1.0, -0.0, +inf, +inf
//! assert_eq!(converted.overflowed(), 1);                   // the source's +inf is not an overflow
//! # Ok::<(), safeload::Error>(())
//! ```
//!
//! # Pairs
//!
//! | from \ to | `F32` | `F16` | `BF16` |
//! |---|---|---|---|
//! | `F64` | rounded | rounded through F32 | rounded through F32 |
//! | `F32` | copied | rounded | rounded |
//! | `F16` | exact | copied | rounded |
//! | `BF16` | exact | rounded | copied |
//! | `F8_E4M3` | exact | exact | exact |
//! | `F8_E5M2` | exact | exact | exact |
//!
//! Any dtype to itself is a copy. Every other pair is refused with
//! [`ErrorKind::UnsupportedConversion`].
//!
//! # Rounding and special values
//!
//! - **Rounding**: to nearest, ties to even; underflow is gradual (to subnormals, or a zero of
//!   the sign), nothing flushed to zero.
//! - **Overflow**: a finite value that rounds beyond the target's largest finite becomes an
//!   infinity of its sign, as `torch.Tensor.to` does, not saturated; [`Converted::overflowed`]
//!   counts these.
//! - **Infinities**, **-0.0** and **NaN** stay so (a NaN's payload need not survive).
//! - **8-bit sources**: `F8_E4M3` is `float8_e4m3fn` (no infinities, largest 448); `F8_E5M2`
//!   is IEEE-like. Both convert exactly into every target.
//!
//! # F64 to F16 and BF16: two roundings
//!
//! `F64` is rounded to `F32`, then to the 16-bit target, as `torch.Tensor.to` does, so the
//! bits are torch's. A value nearer a 16-bit tie than 2^-24 relative lands on the tie and
//! rounds to even (1 + 2^-8 + 2^-30 becomes 1.0 in `BF16`); the result is always one of the
//! two 16-bit values nearest the source.
//!
//! # Speed
//!
//! A conversion runs on the calling thread, in cache-sized blocks: 16-bit types through `f32`
//! with `half`'s slice conversions, 8-bit sources through 256-entry tables. To use more
//! threads, split a large tensor at element boundaries and sum the overflow counts.

mod f8;
mod kernel;
#[cfg(test)]
mod tests;

use safetensors::Dtype;

use crate::error::{Error, ErrorKind, Result};
use kernel::{Source, Target};

/// Whether `from` -> `to` is a conversion this module performs (the [table](self#pairs)).
///
/// ```
/// use safeload::Dtype;
/// use safeload::convert::is_supported;
///
/// assert!(is_supported(Dtype::F8_E4M3, Dtype::BF16));
/// assert!(is_supported(Dtype::I64, Dtype::I64));  // a copy
/// assert!(!is_supported(Dtype::F32, Dtype::F64)); // no widening to F64
/// ```
pub fn is_supported(from: Dtype, to: Dtype) -> bool {
    from == to || (Source::of(from).is_some() && Target::of(to).is_some())
}

/// Converts `src` (little-endian elements of `from`, any alignment) into `dst` (of `to`),
/// which must be exactly as long as the elements need; `from == to` copies.
///
/// # Errors
///
/// [`ErrorKind::UnsupportedConversion`] when [`is_supported`] is false;
/// [`ErrorKind::LengthMismatch`] when `src` is not whole elements (`expected` rounded up) or
/// `dst` has another length. They name no tensor and no file.
pub fn convert(from: Dtype, to: Dtype, src: &[u8], dst: &mut [u8]) -> Result<Converted> {
    if from == to {
        return copy(from, src, dst);
    }
    let (Some(source), Some(target)) = (Source::of(from), Target::of(to)) else {
        return Err(Error::without_path(ErrorKind::UnsupportedConversion {
            tensor: None,
            from,
            to,
        }));
    };
    let elements = whole_elements(src, source.size())?;
    check_length(dst, elements.checked_mul(target.size()))?;
    Ok(Converted {
        overflowed: kernel::run(source, target, src, dst),
    })
}

/// What a conversion did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Converted {
    overflowed: u64,
}

impl Converted {
    /// How many values were finite in the source and became +-infinity.
    pub fn overflowed(&self) -> u64 {
        self.overflowed
    }
}

/// The conversion of a dtype to itself.
fn copy(dtype: Dtype, src: &[u8], dst: &mut [u8]) -> Result<Converted> {
    // Sub-byte dtypes (F4, F6) have no whole-byte element to check against.
    if dtype.bitsize() >= 8 {
        whole_elements(src, dtype.bitsize() / 8)?;
    }
    check_length(dst, Some(src.len()))?;
    dst.copy_from_slice(src);
    Ok(Converted::default())
}

/// The number of `size`-byte elements in `src`, which must hold a whole number of them.
fn whole_elements(src: &[u8], size: usize) -> Result<usize> {
    match src.len() % size {
        0 => Ok(src.len() / size),
        rest => Err(length_mismatch(
            src.len().checked_add(size - rest),
            src.len(),
        )),
    }
}

/// Checks that `dst` is `expected` bytes long (`None`: past `usize`, which no buffer is).
fn check_length(dst: &[u8], expected: Option<usize>) -> Result<()> {
    if expected == Some(dst.len()) {
        Ok(())
    } else {
        Err(length_mismatch(expected, dst.len()))
    }
}

fn length_mismatch(expected: Option<usize>, actual: usize) -> Error {
    let bytes = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    Error::without_path(ErrorKind::LengthMismatch {
        tensor: None,
        expected: expected.map_or(u64::MAX, bytes),
        actual: bytes(actual),
    })
}
