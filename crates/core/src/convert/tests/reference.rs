//! The naive twin: converts one value at a time through exact `f64`
//! arithmetic and an explicit rounding step, with none of the fast path's
//! bit tricks, tables or `half`.

use safetensors::Dtype;

/// A binary floating-point layout: a sign bit, then exponent, then mantissa.
#[derive(Debug, Clone, Copy)]
struct Layout {
    exponent_bits: u32,
    mantissa_bits: u32,
    /// F8_E4M3 ("FN"): no infinities, only S.1111.111 is NaN.
    finite_only: bool,
}

impl Layout {
    fn of(dtype: Dtype) -> Layout {
        let (exponent_bits, mantissa_bits, finite_only) = match dtype {
            Dtype::F64 => (11, 52, false),
            Dtype::F32 => (8, 23, false),
            Dtype::F16 => (5, 10, false),
            Dtype::BF16 => (8, 7, false),
            Dtype::F8_E4M3 => (4, 3, true),
            Dtype::F8_E5M2 => (5, 2, false),
            other => panic!("no float layout for {other}"),
        };
        Layout {
            exponent_bits,
            mantissa_bits,
            finite_only,
        }
    }

    fn bias(self) -> i32 {
        (1 << (self.exponent_bits - 1)) - 1
    }

    fn top_exponent(self) -> u64 {
        (1 << self.exponent_bits) - 1
    }

    fn width(self) -> u32 {
        1 + self.exponent_bits + self.mantissa_bits
    }
}

/// 2^k, exactly, for every k an `f64` can hold (normal or subnormal).
fn pow2(k: i32) -> f64 {
    let mut value = 1.0f64;
    // Steps of at most 2^±60 keep every intermediate exact: it is a power of
    // two within range until the last step, which lands on the exact result.
    let mut left = k;
    while left != 0 {
        let step = left.clamp(-60, 60);
        value *= (2.0f64).powi(step);
        left -= step;
    }
    value
}

/// The value of a bit pattern of `dtype`: exact in `f64` for every float
/// dtype here.
pub(super) fn decode(dtype: Dtype, bits: u64) -> f64 {
    let l = Layout::of(dtype);
    let negative = (bits >> (l.width() - 1)) & 1 == 1;
    let exponent = (bits >> l.mantissa_bits) & l.top_exponent();
    let mantissa = bits & ((1u64 << l.mantissa_bits) - 1);
    let all_ones = (1u64 << l.mantissa_bits) - 1;
    let magnitude = if l.finite_only && exponent == l.top_exponent() && mantissa == all_ones {
        f64::NAN
    } else if !l.finite_only && exponent == l.top_exponent() {
        if mantissa == 0 {
            f64::INFINITY
        } else {
            f64::NAN
        }
    } else if exponent == 0 {
        mantissa as f64 * pow2(1 - l.bias() - l.mantissa_bits as i32)
    } else {
        (1.0 + mantissa as f64 / pow2(l.mantissa_bits as i32)) * pow2(exponent as i32 - l.bias())
    };
    if negative { -magnitude } else { magnitude }
}

/// Rounds `x` to the nearest value of `dtype` (ties to even), returning its
/// bits; beyond the largest finite value, infinity.
pub(super) fn round(x: f64, dtype: Dtype) -> u64 {
    let l = Layout::of(dtype);
    let m = l.mantissa_bits as i32;
    let sign = u64::from(x.is_sign_negative()) << (l.width() - 1);
    let inf = sign | (l.top_exponent() << l.mantissa_bits);
    if x.is_nan() {
        return inf | (1 << (l.mantissa_bits - 1));
    }
    let a = x.abs();
    if a.is_infinite() {
        return inf;
    }
    if a == 0.0 {
        return sign;
    }
    // The binade of `a`, but not below the target's smallest normal one,
    // where the spacing of values stops shrinking (subnormals).
    let binade = if a >= f64::MIN_POSITIVE {
        ((a.to_bits() >> 52) as i32) - 1023
    } else {
        -1023
    };
    let mut exponent = binade.max(1 - l.bias());
    // `a` in units of the last place: rounding to an integer is the rounding.
    let units = a / pow2(exponent - m);
    let whole = units.floor();
    let rest = units - whole;
    let odd = whole % 2.0 == 1.0;
    let mut n = if rest > 0.5 || (rest == 0.5 && odd) {
        whole + 1.0
    } else {
        whole
    };
    if n == pow2(m + 1) {
        n = pow2(m);
        exponent += 1;
    }
    if exponent > l.bias() {
        return inf;
    }
    let n = n as u64;
    if n < (1 << m) {
        return sign | n; // subnormal: exponent field 0
    }
    let biased = (exponent + l.bias()) as u64;
    sign | (biased << l.mantissa_bits) | (n - (1 << m))
}

/// The reference conversion of one value: decode exactly, then round once;
/// from F64 to a 16-bit type, round to F32 first (the module's documented
/// choice).
pub(super) fn convert(from: Dtype, to: Dtype, bits: u64) -> u64 {
    let mut x = decode(from, bits);
    if from == Dtype::F64 && to != Dtype::F32 {
        x = decode(Dtype::F32, round(x, Dtype::F32));
    }
    round(x, to)
}

/// Whether the reference conversion of `bits` is an overflow: finite in,
/// infinite out.
pub(super) fn overflows(from: Dtype, to: Dtype, bits: u64) -> bool {
    decode(from, bits).is_finite() && decode(to, convert(from, to, bits)).is_infinite()
}

/// Whether `bits` is a NaN of `dtype`.
pub(super) fn is_nan(dtype: Dtype, bits: u64) -> bool {
    decode(dtype, bits).is_nan()
}
