//! Exact conversion of the 8-bit floats by table: 256 entries per target,
//! built at compile time.
//!
//! Every F8_E4M3 and F8_E5M2 value is exact in F32, F16 and BF16: no rounding, no overflow.

use super::kernel::{self, Target};

/// The layout of an 8-bit float: 1 sign bit, then exponent, then mantissa.
#[derive(Debug, Clone, Copy)]
struct Layout {
    exponent_bits: u32,
    mantissa_bits: u32,
    /// The "FN" variant: no infinities, only S.1111.111 is NaN. Otherwise as IEEE 754.
    finite_only: bool,
}

/// `float8_e4m3fn`: bias 7, largest finite 448, NaN S.1111.111.
const E4M3_LAYOUT: Layout = Layout {
    exponent_bits: 4,
    mantissa_bits: 3,
    finite_only: true,
};

/// `float8_e5m2`: bias 15, largest finite 57344, IEEE-like infinities and NaNs.
const E5M2_LAYOUT: Layout = Layout {
    exponent_bits: 5,
    mantissa_bits: 2,
    finite_only: false,
};

/// The image of every 8-bit pattern in each target, as bits.
pub(super) struct Tables {
    f32: [u32; 256],
    f16: [u16; 256],
    bf16: [u16; 256],
}

pub(super) static E4M3: Tables = Tables::build(E4M3_LAYOUT);
pub(super) static E5M2: Tables = Tables::build(E5M2_LAYOUT);

impl Tables {
    // Only evaluated at compile time: an index out of bounds would fail the build.
    #[allow(clippy::indexing_slicing)]
    const fn build(layout: Layout) -> Tables {
        let mut tables = Tables {
            f32: [0; 256],
            f16: [0; 256],
            bf16: [0; 256],
        };
        let mut byte = 0;
        while byte < 256 {
            let bits = to_f32_bits(byte as u8, layout);
            tables.f32[byte] = bits;
            // Exact values: `half`'s const conversions give the bits and keep a NaN a NaN.
            let value = f32::from_bits(bits);
            tables.f16[byte] = half::f16::from_f32_const(value).to_bits();
            tables.bf16[byte] = half::bf16::from_f32_const(value).to_bits();
            byte += 1;
        }
        tables
    }

    fn f32(&self, byte: u8) -> u32 {
        self.f32.get(usize::from(byte)).copied().unwrap_or_default()
    }
}

/// `table`'s entry for `byte`.
fn at(table: &[u16; 256], byte: u8) -> u16 {
    table.get(usize::from(byte)).copied().unwrap_or_default()
}

/// The F32 bits of one 8-bit float.
const fn to_f32_bits(byte: u8, layout: Layout) -> u32 {
    const QUIET_NAN: u32 = 0x7FC0_0000;
    let m_bits = layout.mantissa_bits;
    let top_exponent = (1 << layout.exponent_bits) - 1;
    let bias = (1 << (layout.exponent_bits - 1)) - 1;
    let sign = ((byte as u32) & 0x80) << 24;
    let exponent = ((byte as u32) >> m_bits) & top_exponent;
    let mantissa = (byte as u32) & ((1 << m_bits) - 1);

    if layout.finite_only {
        if exponent == top_exponent && mantissa == (1 << m_bits) - 1 {
            return sign | QUIET_NAN;
        }
    } else if exponent == top_exponent {
        return match mantissa {
            0 => sign | 0x7F80_0000,
            payload => sign | QUIET_NAN | (payload << (23 - m_bits)),
        };
    }
    if exponent == 0 {
        if mantissa == 0 {
            return sign;
        }
        // A subnormal is normal in F32: its leading one (bit `lead`) becomes the implicit one.
        let lead = 31 - mantissa.leading_zeros();
        let f32_exponent = 127 + 1 - bias - m_bits + lead;
        let fraction = (mantissa << (23 - lead)) & 0x007F_FFFF;
        return sign | (f32_exponent << 23) | fraction;
    }
    sign | ((exponent + 127 - bias) << 23) | (mantissa << (23 - m_bits))
}

/// Converts a block of 8-bit floats into `target` elements in `dst`.
pub(super) fn convert(tables: &Tables, target: Target, src: &[u8], dst: &mut [u8]) {
    match target {
        Target::F32 => put(dst, src, |b| tables.f32(b)),
        Target::F16 => put(dst, src, |b| at(&tables.f16, b)),
        Target::BF16 => put(dst, src, |b| at(&tables.bf16, b)),
    }
}

/// Writes `f` of each byte into `dst`: in place where aligned, else byte by byte.
fn put<T: kernel::LeBytes + bytemuck::Pod>(dst: &mut [u8], src: &[u8], f: impl Fn(u8) -> T) {
    match kernel::cast_mut::<T>(dst) {
        Some(out) => fill(out, src, f),
        None => kernel::write_le(src.iter().map(|b| f(*b)), dst),
    }
}

/// Decodes a block of 8-bit floats into `out`, one `f32` per byte.
pub(super) fn decode_f32(tables: &Tables, src: &[u8], out: &mut [f32]) {
    fill(out, src, |b| f32::from_bits(tables.f32(b)));
}

/// Writes `f` of each byte into the matching slot of `out`.
fn fill<T>(out: &mut [T], src: &[u8], f: impl Fn(u8) -> T) {
    for (o, b) in out.iter_mut().zip(src) {
        *o = f(*b);
    }
}
