//! Converts tensor bytes from one floating-point dtype to another: bytes in, bytes out.
//!
//! [`convert`] reads little-endian elements of one dtype from a byte slice
//! (aligned or not: it may be a slice of a mapped file) and writes
//! little-endian elements of another into a buffer the caller owns. It
//! allocates nothing, opens nothing and never panics; [`is_supported`] says
//! which pairs it converts, and the [`Converted`] it returns counts the
//! values that overflowed to infinity.
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
//! Any dtype to itself is a copy, also for the integer, boolean and packed
//! dtypes. Every other pair is refused with
//! [`ErrorKind::UnsupportedConversion`].
//!
//! # Rounding and special values
//!
//! - **Rounding**: to nearest, ties to even. A value the target cannot hold
//!   becomes the nearest value it can; of two equally near, the one whose
//!   last mantissa bit is 0.
//! - **Overflow**: a finite value that rounds beyond the target's largest
//!   finite value becomes an infinity of its sign, as `torch.Tensor.to`
//!   does; it is not saturated. [`Converted::overflowed`] counts these.
//!   Overflow can only happen from `F64`, from `F32` to `F16` or `BF16`, and
//!   from `BF16` to `F16` (whose largest finite is 65504).
//! - **Underflow** is gradual: tiny values round to the target's subnormals,
//!   or to a zero of their sign, by the same rule; nothing is flushed to zero.
//!   Subnormal sources convert exactly like any other value.
//! - **Infinities** stay infinities of their sign, **-0.0** stays -0.0,
//!   **NaN** stays NaN (its payload need not survive; it comes out quiet).
//! - **8-bit sources**: `F8_E4M3` is the "FN" variant (`float8_e4m3fn`):
//!   no infinities, NaN is S.1111.111, the largest finite is 448. `F8_E5M2`
//!   is IEEE-like: S.11111.00 is infinity, S.11111.xx otherwise NaN, the
//!   largest finite 57344. Both convert exactly into every target.
//!
//! # F64 to F16 and BF16: two roundings
//!
//! `F64` is first rounded to `F32`, then to the 16-bit target. This is what
//! `torch.Tensor.to` does (its 16-bit floats are built from a 32-bit
//! float), so an `F64` checkpoint loaded as `BF16` gets the same bits as
//! `tensor.to(torch.bfloat16)`, and the second step is the vectorised `F32`
//! path. The cost is rare and bounded: a value nearer a tie between two
//! 16-bit neighbours than half an `F32` unit (2^-24 relative) lands on the
//! tie in `F32` and then rounds to even, not to the nearer neighbour. For
//! instance 1 + 2^-8 + 2^-30 becomes 1.0 in `BF16` where one correct
//! rounding would give 1.0078125, and 65519.999999 becomes +inf in `F16`
//! (an overflow) where one rounding would give 65504. The result is always
//! one of the two 16-bit values nearest the source.
//!
//! # Speed
//!
//! A conversion runs on the calling thread, in blocks of 2048 elements that
//! stay in the cache: 16-bit sources and targets go through `f32` with
//! `half`'s slice conversions (F16C on x86-64 for F16), 8-bit sources
//! through 256-entry tables built at compile time. Blocks are cut at whole
//! multiples of the block size, so a source or destination aligned for its
//! element type is read or written in place; an unaligned one is staged
//! through an aligned stack buffer and stays on the vector path.
//!
//! Overflow costs a scan of each converted block for non-finite values, and
//! only for the pairs that can overflow; the rare block that has some is
//! counted, and its source scanned for the infinities it already had.
//!
//! To use more threads, split a large tensor at element boundaries and
//! convert the pieces in parallel, summing their overflow counts.

mod f8;
mod kernel;
#[cfg(test)]
mod tests;

use safetensors::Dtype;

use crate::error::{Error, ErrorKind, Result};
use kernel::{Source, Target};

/// Whether `from` -> `to` is a conversion this module performs: the pairs of
/// the [table](self#pairs), and any dtype to itself.
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

/// Converts `src` (little-endian elements of `from`, any alignment) into
/// `dst` (little-endian elements of `to`).
///
/// `dst.len()` must be exactly the number of elements times the size of
/// `to`. The rounding rule and what happens to NaN, infinities and -0.0 are
/// in the [module docs](self#rounding-and-special-values). With
/// `from == to`, `src` is copied (for the sub-byte dtypes, `dst` must then
/// be as long as `src`).
///
/// # Errors
///
/// - [`ErrorKind::UnsupportedConversion`] when [`is_supported`] is false.
/// - [`ErrorKind::LengthMismatch`] when `src` is not a whole number of
///   elements (`expected` is then its length rounded up to the next whole
///   element), or when `dst` does not have the length the elements need.
///
/// The errors name no tensor and no file; a caller converting a tensor adds
/// them.
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
    /// How many values were finite in the source and became +-infinity
    /// because they rounded beyond the target's largest finite value.
    /// Infinities already in the source are not counted.
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

/// The number of `size`-byte elements in `src`, which must hold a whole
/// number of them.
fn whole_elements(src: &[u8], size: usize) -> Result<usize> {
    match src.len() % size {
        0 => Ok(src.len() / size),
        rest => Err(length_mismatch(
            src.len().checked_add(size - rest),
            src.len(),
        )),
    }
}

/// Checks that `dst` is `expected` bytes long (`None`: more than `usize`
/// holds, which no buffer is).
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
