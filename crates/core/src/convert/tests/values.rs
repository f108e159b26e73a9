//! Known results, value by value, for every pair: ties both ways, values
//! just off ties, subnormals in and out, NaN, infinities, overflow, -0.0,
//! the largest finite values. Bit patterns are written out by hand; the
//! comment on each says what it is.

use safetensors::Dtype::{self, *};

use super::{fast, reference};

/// A NaN of the target, where any NaN will do (the payload need not survive).
const NAN: u64 = u64::MAX;

/// Converts each `(source bits, expected bits)` one at a time, aligned and
/// not, and checks the bits and the overflow count: one exactly when a
/// finite source gives an infinity.
fn check(from: Dtype, to: Dtype, cases: &[(u64, u64)]) {
    for &(src, expected) in cases {
        let overflow = reference::decode(from, src).is_finite()
            && expected != NAN
            && reference::decode(to, expected).is_infinite();
        for offset in [0, 1] {
            let (out, overflowed) = fast(from, to, &[src], offset, offset);
            let what = format!("{from} {src:#x} -> {to} (offset {offset})");
            if expected == NAN {
                assert!(
                    reference::is_nan(to, out[0]),
                    "{what}: got {:#x}, want NaN",
                    out[0]
                );
            } else {
                assert_eq!(
                    out[0], expected,
                    "{what}: got {:#x}, want {expected:#x}",
                    out[0]
                );
            }
            assert_eq!(overflowed, u64::from(overflow), "{what}: overflow count");
        }
    }
}

#[test]
fn f64_to_f32() {
    check(
        F64,
        F32,
        &[
            (0x3FF0_0000_0000_0000, 0x3F80_0000), // 1.0
            (0x3FF0_0000_1000_0000, 0x3F80_0000), // 1 + 2^-24: tie, down to even
            (0x3FF0_0000_3000_0000, 0x3F80_0002), // 1 + 3*2^-24: tie, up to even
            (0x3FF0_0000_0FFF_FFFF, 0x3F80_0000), // just below the tie
            (0x3FF0_0000_1000_0001, 0x3F80_0001), // just above the tie
            (0x47EF_FFFF_E000_0000, 0x7F7F_FFFF), // f32::MAX, exact
            (0x47EF_FFFF_EFFF_FFFF, 0x7F7F_FFFF), // just below MAX + half an ulp
            (0x47EF_FFFF_F000_0000, 0x7F80_0000), // MAX + half an ulp: tie, to even = inf
            (0xC7EF_FFFF_F000_0000, 0xFF80_0000), // its negative: -inf
            (0x7FEF_FFFF_FFFF_FFFF, 0x7F80_0000), // f64::MAX: overflow
            (0x36A0_0000_0000_0000, 0x0000_0001), // 2^-149: the smallest f32 subnormal
            (0x3690_0000_0000_0000, 0x0000_0000), // 2^-150: tie, down to 0
            (0x36A8_0000_0000_0000, 0x0000_0002), // 3*2^-150: tie, up to 2^-148
            (0x3690_0000_0000_0001, 0x0000_0001), // just above 2^-150
            (0x380F_FFFF_C000_0000, 0x007F_FFFF), // the largest f32 subnormal
            (0x0000_0000_0000_0001, 0x0000_0000), // the smallest f64 subnormal
            (0x8000_0000_0000_0001, 0x8000_0000), // and its negative: -0.0
            (0x8000_0000_0000_0000, 0x8000_0000), // -0.0
            (0x7FF0_0000_0000_0000, 0x7F80_0000), // +inf, not an overflow
            (0xFFF0_0000_0000_0000, 0xFF80_0000), // -inf
            (0x7FF8_0000_0000_0000, NAN),
            (0x7FF0_0000_0000_0001, NAN), // payload only in bits f32 drops
            (0xFFF8_0000_0000_0000, NAN),
        ],
    );
}

#[test]
fn f64_to_bf16_rounds_through_f32() {
    check(
        F64,
        BF16,
        &[
            (0x3FF0_0000_0000_0000, 0x3F80), // 1.0
            (0x3FF0_1000_0000_0000, 0x3F80), // 1 + 2^-8: tie, down to even
            (0x3FF0_3000_0000_0000, 0x3F82), // 1 + 3*2^-8: tie, up to even
            (0x3FF0_1001_0000_0000, 0x3F81), // 1 + 2^-8 + 2^-20: above the tie, also in f32
            // 1 + 2^-8 + 2^-30: above the tie, but f32 rounds it onto the tie,
            // which goes to even. One correct rounding would give 0x3F81.
            (0x3FF0_1000_0040_0000, 0x3F80),
            (0x47EF_E000_0000_0000, 0x7F7F), // bf16::MAX
            (0x47EF_F000_0000_0000, 0x7F80), // bf16::MAX + half an ulp: overflow
            (0x7FEF_FFFF_FFFF_FFFF, 0x7F80), // f64::MAX: overflow
            (0x37A0_0000_0000_0000, 0x0001), // 2^-133: the smallest bf16 subnormal
            (0x3790_0000_0000_0000, 0x0000), // 2^-134: tie, down to 0
            (0x8000_0000_0000_0000, 0x8000), // -0.0
            (0x7FF0_0000_0000_0000, 0x7F80), // +inf
            (0xFFF0_0000_0000_0000, 0xFF80), // -inf
            (0x7FF8_0000_0000_0000, NAN),
            (0x7FF0_0000_0000_0001, NAN),
        ],
    );
}

#[test]
fn f64_to_f16_rounds_through_f32() {
    check(
        F64,
        F16,
        &[
            (0x3FF0_0000_0000_0000, 0x3C00), // 1.0
            (0x3FF0_0200_0000_0000, 0x3C00), // 1 + 2^-11: tie, down to even
            (0x3FF0_0600_0000_0000, 0x3C02), // 1 + 3*2^-11: tie, up to even
            (0x3FF0_0201_0000_0000, 0x3C01), // 1 + 2^-11 + 2^-20: above the tie
            (0x3FF0_0200_0000_1000, 0x3C00), // 1 + 2^-11 + 2^-40: onto the tie in f32
            (0x40EF_FC00_0000_0000, 0x7BFF), // 65504: f16::MAX
            (0x40EF_FDFF_C000_0000, 0x7BFF), // 65520 - 2^-7: below the tie, also in f32
            // 65520 - 2^-20: rounds to 65520 in f32, the tie above f16::MAX,
            // which goes to even: +inf, an overflow (one rounding: 65504).
            (0x40EF_FDFF_FFFE_0000, 0x7C00),
            (0x40EF_FE00_0000_0000, 0x7C00), // 65520: overflow
            (0x3E70_0000_0000_0000, 0x0001), // 2^-24: the smallest f16 subnormal
            (0x3E60_0000_0000_0000, 0x0000), // 2^-25: tie, down to 0
            (0x3E78_0000_0000_0000, 0x0002), // 3*2^-25: tie, up to 2^-23
            (0x8000_0000_0000_0000, 0x8000), // -0.0
            (0x7FF0_0000_0000_0000, 0x7C00), // +inf
            (0xFFF0_0000_0000_0000, 0xFC00), // -inf
            (0x7FF8_0000_0000_0000, NAN),
        ],
    );
}

#[test]
fn f32_to_f16() {
    check(
        F32,
        F16,
        &[
            (0x3F80_0000, 0x3C00), // 1.0
            (0x3F80_1000, 0x3C00), // 1 + 2^-11: tie, down to even
            (0x3F80_3000, 0x3C02), // 1 + 3*2^-11: tie, up to even
            (0x3F80_0FFF, 0x3C00), // just below the tie
            (0x3F80_1001, 0x3C01), // just above the tie
            (0x477F_E000, 0x7BFF), // 65504: f16::MAX
            (0x477F_EFFF, 0x7BFF), // just below 65520
            (0x477F_F000, 0x7C00), // 65520: tie above MAX, to even = inf
            (0xC77F_F000, 0xFC00), // -65520: -inf
            (0x7F7F_FFFF, 0x7C00), // f32::MAX: overflow
            (0x3380_0000, 0x0001), // 2^-24: the smallest f16 subnormal
            (0x3300_0000, 0x0000), // 2^-25: tie, down to 0
            (0x3300_0001, 0x0001), // just above 2^-25
            (0x32FF_FFFF, 0x0000), // just below 2^-25
            (0x33C0_0000, 0x0002), // 1.5*2^-24: tie, up to even
            (0x3420_0000, 0x0002), // 2.5*2^-24: tie, down to even
            (0x387F_C000, 0x03FF), // the largest f16 subnormal, exact
            (0x387F_E000, 0x0400), // 1023.5*2^-24: tie, up into the normals
            (0x3880_0000, 0x0400), // 2^-14: the smallest f16 normal
            (0x0000_0001, 0x0000), // f32 subnormal: to 0
            (0x8000_0001, 0x8000), // negative f32 subnormal: to -0.0
            (0x8000_0000, 0x8000), // -0.0
            (0x7F80_0000, 0x7C00), // +inf, not an overflow
            (0xFF80_0000, 0xFC00), // -inf
            (0x7FC0_0000, NAN),
            (0xFFC0_0000, NAN),
            (0x7F80_0001, NAN), // payload only in bits f16 drops
        ],
    );
}

#[test]
fn f32_to_bf16() {
    check(
        F32,
        BF16,
        &[
            (0x3F80_0000, 0x3F80), // 1.0
            (0x3F80_8000, 0x3F80), // 1 + 2^-8: tie, down to even
            (0x3F81_8000, 0x3F82), // 1 + 3*2^-8: tie, up to even
            (0x3F80_7FFF, 0x3F80), // just below the tie
            (0x3F80_8001, 0x3F81), // just above the tie
            (0x7F7F_0000, 0x7F7F), // bf16::MAX
            (0x7F7F_7FFF, 0x7F7F), // just below MAX + half an ulp
            (0x7F7F_8000, 0x7F80), // MAX + half an ulp: tie, to even = inf
            (0xFF7F_8000, 0xFF80), // its negative: -inf
            (0x7F7F_FFFF, 0x7F80), // f32::MAX: overflow
            (0x0001_0000, 0x0001), // 2^-133: the smallest bf16 subnormal
            (0x0000_8000, 0x0000), // 2^-134: tie, down to 0
            (0x0001_8000, 0x0002), // 3*2^-134: tie, up to even
            (0x0000_8001, 0x0001), // just above the tie
            (0x0000_7FFF, 0x0000), // just below it
            (0x0040_0000, 0x0040), // a subnormal, exact
            (0x007F_FFFF, 0x0080), // the largest f32 subnormal: up into the normals
            (0x8000_0001, 0x8000), // to -0.0
            (0x8000_0000, 0x8000), // -0.0
            (0x7F80_0000, 0x7F80), // +inf, not an overflow
            (0xFF80_0000, 0xFF80), // -inf
            (0x7FC0_0000, NAN),
            (0xFFC0_0000, NAN),
            (0x7F80_0001, NAN), // payload only in the dropped bits: still NaN
            (0xFF80_0001, NAN),
            (0x7FFF_FFFF, NAN), // the largest NaN: must not carry into the sign
        ],
    );
}

#[test]
fn f16_to_f32_is_exact() {
    check(
        F16,
        F32,
        &[
            (0x3C00, 0x3F80_0000), // 1.0
            (0x0001, 0x3380_0000), // the smallest subnormal, 2^-24
            (0x8001, 0xB380_0000), // its negative
            (0x03FF, 0x387F_C000), // the largest subnormal
            (0x0400, 0x3880_0000), // the smallest normal
            (0x7BFF, 0x477F_E000), // 65504
            (0x8000, 0x8000_0000), // -0.0
            (0x7C00, 0x7F80_0000), // +inf
            (0xFC00, 0xFF80_0000), // -inf
            (0x7E00, NAN),
            (0x7C01, NAN),
            (0xFE00, NAN),
        ],
    );
}

#[test]
fn f16_to_bf16() {
    check(
        F16,
        BF16,
        &[
            (0x3C00, 0x3F80), // 1.0
            (0x3C04, 0x3F80), // 1 + 2^-8: tie, down to even
            (0x3C0C, 0x3F82), // 1 + 3*2^-8: tie, up to even
            (0x3C03, 0x3F80), // just below the tie
            (0x3C05, 0x3F81), // just above it
            (0x7BFF, 0x4780), // 65504 rounds up to 65536: finite, no overflow
            (0x0001, 0x3380), // 2^-24, a subnormal source, exact
            (0x03FF, 0x3880), // the largest subnormal: rounds up to 2^-14
            (0x8000, 0x8000), // -0.0
            (0x7C00, 0x7F80), // +inf
            (0xFC00, 0xFF80), // -inf
            (0x7E00, NAN),
            (0x7C01, NAN), // payload only in bits bf16 drops
        ],
    );
}

#[test]
fn bf16_to_f32_is_exact() {
    check(
        BF16,
        F32,
        &[
            (0x3F80, 0x3F80_0000), // 1.0
            (0x0001, 0x0001_0000), // the smallest subnormal
            (0x7F7F, 0x7F7F_0000), // bf16::MAX
            (0xFF7F, 0xFF7F_0000), // -bf16::MAX
            (0x8000, 0x8000_0000), // -0.0
            (0x7F80, 0x7F80_0000), // +inf
            (0xFF80, 0xFF80_0000), // -inf
            (0x7FC0, NAN),
            (0x7F81, NAN),
        ],
    );
}

#[test]
fn bf16_to_f16() {
    check(
        BF16,
        F16,
        &[
            (0x3F80, 0x3C00), // 1.0
            (0x477F, 0x7BF8), // 65280, exact
            (0x4780, 0x7C00), // 65536: overflow
            (0xC780, 0xFC00), // -65536: overflow
            (0x7F7F, 0x7C00), // bf16::MAX: overflow
            (0x3300, 0x0000), // 2^-25: tie, down to 0
            (0x33C0, 0x0002), // 1.5*2^-24: tie, up to even
            (0x3420, 0x0002), // 2.5*2^-24: tie, down to even
            (0x3301, 0x0001), // just above 2^-25
            (0x32FF, 0x0000), // just below 2^-25
            (0x3581, 0x0010), // 16.125*2^-24: rounds to a subnormal
            (0x0001, 0x0000), // a bf16 subnormal: underflows to 0, not an overflow
            (0x8001, 0x8000), // to -0.0
            (0x8000, 0x8000), // -0.0
            (0x7F80, 0x7C00), // +inf, not an overflow
            (0xFF80, 0xFC00), // -inf
            (0x7FC0, NAN),
            (0x7F81, NAN),
        ],
    );
}

#[test]
fn f8_e4m3_to_every_target() {
    // (byte, f32, f16, bf16)
    let cases: [(u64, u64, u64, u64); 11] = [
        (0x7E, 0x43E0_0000, 0x5F00, 0x43E0), // 448: the largest finite
        (0xFE, 0xC3E0_0000, 0xDF00, 0xC3E0), // -448
        (0x78, 0x4380_0000, 0x5C00, 0x4380), // 256: the top exponent is finite
        (0x38, 0x3F80_0000, 0x3C00, 0x3F80), // 1.0
        (0x01, 0x3B00_0000, 0x1800, 0x3B00), // 2^-9: the smallest subnormal
        (0x07, 0x3C60_0000, 0x2300, 0x3C60), // 7*2^-9: the largest subnormal
        (0x08, 0x3C80_0000, 0x2400, 0x3C80), // 2^-6: the smallest normal
        (0x00, 0x0000_0000, 0x0000, 0x0000), // 0.0
        (0x80, 0x8000_0000, 0x8000, 0x8000), // -0.0
        (0x7F, NAN, NAN, NAN),               // S.1111.111: the only NaN
        (0xFF, NAN, NAN, NAN),
    ];
    check(F8_E4M3, F32, &cases.map(|(b, f, _, _)| (b, f)));
    check(F8_E4M3, F16, &cases.map(|(b, _, h, _)| (b, h)));
    check(F8_E4M3, BF16, &cases.map(|(b, _, _, h)| (b, h)));
}

#[test]
fn f8_e5m2_to_every_target() {
    // (byte, f32, f16, bf16)
    let cases: [(u64, u64, u64, u64); 12] = [
        (0x7B, 0x4760_0000, 0x7B00, 0x4760), // 57344: the largest finite
        (0x7C, 0x7F80_0000, 0x7C00, 0x7F80), // +inf
        (0xFC, 0xFF80_0000, 0xFC00, 0xFF80), // -inf
        (0x3C, 0x3F80_0000, 0x3C00, 0x3F80), // 1.0
        (0x01, 0x3780_0000, 0x0100, 0x3780), // 2^-16: the smallest subnormal
        (0x03, 0x3840_0000, 0x0300, 0x3840), // 3*2^-16: the largest subnormal
        (0x04, 0x3880_0000, 0x0400, 0x3880), // 2^-14: the smallest normal
        (0x80, 0x8000_0000, 0x8000, 0x8000), // -0.0
        (0x7D, NAN, NAN, NAN),
        (0x7E, NAN, NAN, NAN),
        (0x7F, NAN, NAN, NAN),
        (0xFF, NAN, NAN, NAN),
    ];
    check(F8_E5M2, F32, &cases.map(|(b, f, _, _)| (b, f)));
    check(F8_E5M2, F16, &cases.map(|(b, _, h, _)| (b, h)));
    check(F8_E5M2, BF16, &cases.map(|(b, _, _, h)| (b, h)));
}

#[test]
fn overflows_are_counted_across_blocks_and_infinities_are_not() {
    // F32 -> F16 over several blocks: overflows at the ends and across a
    // block boundary, source infinities and NaNs in between.
    let n = 3 * super::kernel::BLOCK + 7;
    let mut bits = vec![0x3F80_0000u64; n]; // 1.0
    let overflowing = [0, 5, super::kernel::BLOCK - 1, super::kernel::BLOCK, n - 1];
    for &i in &overflowing {
        bits[i] = 0x4780_0000; // 65536
    }
    for i in [1, 2 * super::kernel::BLOCK + 3] {
        bits[i] = 0x7F80_0000; // +inf
    }
    bits[7] = 0x7FC0_0000; // NaN
    let (out, overflowed) = fast(F32, F16, &bits, 0, 0);
    assert_eq!(overflowed, overflowing.len() as u64);
    assert_eq!(
        out.iter().filter(|&&h| h == 0x7C00).count(),
        overflowing.len() + 2
    );
}

/// The fast path rounds F32 to F16 and BF16 with `half`'s slice
/// conversions (and builds the 8-bit tables with its const ones): they must
/// round to nearest even and overflow to infinity, scalar and slice alike.
#[test]
fn half_rounds_to_nearest_even_and_overflows_to_inf() {
    use half::slice::HalfFloatSliceExt;
    use half::{bf16, f16};
    let inputs: Vec<f32> = [
        0x3F80_1000u32,
        0x3F80_3000,
        0x3F80_0FFF,
        0x3F80_1001,
        0x3F80_8000,
        0x3F81_8000,
        0x3F80_7FFF,
        0x3F80_8001,
        0x477F_EFFF,
        0x477F_F000,
        0x7F7F_FFFF,
        0x7F7F_8000,
        0x7F7F_7FFF,
        0x3300_0000,
        0x33C0_0000,
        0x387F_E000,
        0x0000_8000,
        0x0001_8000,
        0xC77F_F000,
        0xFF7F_8000,
        0x8000_0001,
    ]
    .iter()
    .map(|&b| f32::from_bits(b))
    .collect();
    let mut halves = vec![f16::ZERO; inputs.len()];
    halves.convert_from_f32_slice(&inputs);
    let mut bhalves = vec![bf16::ZERO; inputs.len()];
    bhalves.convert_from_f32_slice(&inputs);
    for (i, x) in inputs.iter().enumerate() {
        let want16 = reference::round(f64::from(*x), F16);
        let want_b = reference::round(f64::from(*x), BF16);
        assert_eq!(
            u64::from(f16::from_f32(*x).to_bits()),
            want16,
            "f16::from_f32({x:e})"
        );
        assert_eq!(u64::from(halves[i].to_bits()), want16, "f16 slice ({x:e})");
        assert_eq!(
            u64::from(f16::from_f32_const(*x).to_bits()),
            want16,
            "f16::from_f32_const({x:e})"
        );
        assert_eq!(
            u64::from(bf16::from_f32(*x).to_bits()),
            want_b,
            "bf16::from_f32({x:e})"
        );
        assert_eq!(
            u64::from(bf16::from_f32_const(*x).to_bits()),
            want_b,
            "bf16::from_f32_const({x:e})"
        );
        assert_eq!(
            u64::from(bhalves[i].to_bits()),
            want_b,
            "bf16 slice ({x:e})"
        );
    }
}
