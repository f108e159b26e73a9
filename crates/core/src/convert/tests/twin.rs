//! The fast path against its naive twin ([`reference`]): over every bit
//! pattern of the 8- and 16-bit sources, over a sweep of ties and random
//! bits for F32 and F64, aligned and not, at lengths around the block size;
//! and as a property test over random bytes.

use proptest::prelude::*;
use proptest::sample::select;
use safetensors::Dtype::{self, *};

use super::kernel::BLOCK;
use super::{PAIRS, fast, reference, size};

/// Byte offsets of source and destination: aligned, unaligned for every
/// multi-byte type, aligned for 16-bit but not 32-bit types, aligned for
/// 32-bit but not 64-bit ones.
const OFFSETS: [(usize, usize); 6] = [(0, 0), (1, 0), (0, 1), (1, 1), (2, 2), (4, 6)];

/// Checks the fast conversion of `bits` at the given offsets against the
/// reference, element by element, and the overflow count.
fn compare(from: Dtype, to: Dtype, bits: &[u64], src_offset: usize, dst_offset: usize) {
    let (out, overflowed) = fast(from, to, bits, src_offset, dst_offset);
    assert_eq!(out.len(), bits.len());
    let mut overflows = 0;
    for (i, (&src, &got)) in bits.iter().zip(&out).enumerate() {
        let want = reference::convert(from, to, src);
        let what = || {
            format!(
                "{from} -> {to}, element {i} of {} (offsets {src_offset}, {dst_offset}): \
                 {src:#x} gave {got:#x}, want {want:#x}",
                bits.len()
            )
        };
        if reference::is_nan(to, want) {
            assert!(reference::is_nan(to, got), "{}", what());
        } else {
            assert_eq!(got, want, "{}", what());
        }
        overflows += u64::from(reference::overflows(from, to, src));
    }
    assert_eq!(overflowed, overflows, "{from} -> {to}: overflow count");
}

fn targets_of(from: Dtype) -> impl Iterator<Item = Dtype> {
    PAIRS
        .into_iter()
        .filter(move |(f, _)| *f == from)
        .map(|(_, to)| to)
}

/// A deterministic stream of pseudo-random bits (splitmix64).
struct Bits(u64);

impl Bits {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Bit patterns of an `exponent_bits`/`mantissa_bits` float that sit on,
/// just below and just above every possible rounding tie (at each mantissa
/// bit, with an even and an odd kept part), at the given biased exponents,
/// both signs; plus random patterns.
fn sweep(
    exponent_bits: u32,
    mantissa_bits: u32,
    exponents: impl Iterator<Item = u64>,
    random: usize,
) -> Vec<u64> {
    let mut rng = Bits(0x5AFE_10AD);
    let mantissa_mask = (1u64 << mantissa_bits) - 1;
    let width = 1 + exponent_bits + mantissa_bits;
    let mut out = Vec::new();
    for exponent in exponents {
        for sign in [0, 1u64] {
            let top = (sign << (width - 1)) | (exponent << mantissa_bits);
            out.push(top);
            out.push(top | mantissa_mask);
            for k in 0..mantissa_bits {
                let tie = 1u64 << k;
                let above = !((tie << 1) - 1) & mantissa_mask;
                for kept in [0, tie << 1, rng.next() & above] {
                    for dropped in [tie, tie - 1, tie + 1] {
                        out.push(top | ((kept | dropped) & mantissa_mask));
                    }
                }
            }
        }
    }
    let all = u64::MAX >> (64 - width);
    out.extend((0..random).map(|_| rng.next() & all));
    out
}

#[test]
fn every_16_bit_pattern_matches_the_reference() {
    let all: Vec<u64> = (0..=u64::from(u16::MAX)).collect();
    for from in [F16, BF16] {
        for to in targets_of(from) {
            for (src_offset, dst_offset) in [(0, 0), (1, 3)] {
                compare(from, to, &all, src_offset, dst_offset);
            }
        }
    }
}

#[test]
fn every_8_bit_pattern_matches_the_reference() {
    let all: Vec<u64> = (0..=u64::from(u8::MAX)).collect();
    for from in [F8_E4M3, F8_E5M2] {
        for to in targets_of(from) {
            for (src_offset, dst_offset) in [(0, 0), (0, 1)] {
                compare(from, to, &all, src_offset, dst_offset);
            }
        }
    }
}

#[test]
fn f32_ties_and_random_bits_match_the_reference() {
    let bits = sweep(8, 23, 0..=255, 1 << 18);
    for to in [F16, BF16] {
        for (src_offset, dst_offset) in [(0, 0), (1, 1)] {
            compare(F32, to, &bits, src_offset, dst_offset);
        }
    }
}

#[test]
fn f64_ties_and_random_bits_match_the_reference() {
    // Every binade an F32, F16 or BF16 result can come from, the extremes,
    // and random bits (mostly far out of range).
    let exponents = (0..4).chain(1023 - 160..=1023 + 130).chain(2044..=2047);
    let bits = sweep(11, 52, exponents, 1 << 16);
    for to in [F32, F16, BF16] {
        for (src_offset, dst_offset) in [(0, 0), (1, 1)] {
            compare(F64, to, &bits, src_offset, dst_offset);
        }
    }
}

#[test]
fn every_pair_matches_the_reference_around_block_boundaries() {
    let mut rng = Bits(42);
    for (from, to) in PAIRS {
        let width = 8 * size(from) as u32;
        let pool: Vec<u64> = (0..3 * BLOCK + 5)
            .map(|_| rng.next() >> (64 - width))
            .collect();
        for len in [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK + 3] {
            for (src_offset, dst_offset) in OFFSETS {
                compare(from, to, &pool[..len], src_offset, dst_offset);
            }
        }
    }
}

/// `PROPTEST_CASES` if set, else 64. Failures are not persisted: one found
/// here becomes a case in `values.rs`, which says what it is.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(64);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_bytes_match_the_reference(
        (from, to) in select(PAIRS.to_vec()),
        bytes in proptest::collection::vec(any::<u8>(), 0..6 * 1024),
        src_offset in 0..8usize,
        dst_offset in 0..8usize,
    ) {
        let bits: Vec<u64> = super::from_bytes(from, &bytes);
        compare(from, to, &bits, src_offset, dst_offset);
    }
}
