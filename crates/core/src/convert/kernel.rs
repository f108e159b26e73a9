//! The block loop behind [`convert`](super::convert): decode a block of source
//! elements, encode it into the target, count what overflowed.
//!
//! Every conversion but the 8-bit ones goes through `f32` (exact for F16 and BF16, what
//! `half`'s vectorised conversions take); a block stays in L1 between its passes, and the
//! scratch lives on the stack.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use safetensors::Dtype;

use super::f8;

/// Elements per block.
///
/// NOTE: no size from 256 to 4096 stood out; 2048 keeps the scratch at 12 KiB of stack
/// (BENCHMARKS.md, "convert/kernel.rs: BLOCK").
pub(super) const BLOCK: usize = 2048;

/// A source dtype [`convert`](super::convert) reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    F64,
    F32,
    F16,
    BF16,
    F8E4M3,
    F8E5M2,
}

/// A target dtype [`convert`](super::convert) writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    F32,
    F16,
    BF16,
}

impl Source {
    pub(super) fn of(dtype: Dtype) -> Option<Source> {
        Some(match dtype {
            Dtype::F64 => Source::F64,
            Dtype::F32 => Source::F32,
            Dtype::F16 => Source::F16,
            Dtype::BF16 => Source::BF16,
            Dtype::F8_E4M3 => Source::F8E4M3,
            Dtype::F8_E5M2 => Source::F8E5M2,
            _ => return None,
        })
    }

    pub(super) fn size(self) -> usize {
        match self {
            Source::F64 => 8,
            Source::F32 => 4,
            Source::F16 | Source::BF16 => 2,
            Source::F8E4M3 | Source::F8E5M2 => 1,
        }
    }

    /// The largest finite value.
    fn max_finite(self) -> f64 {
        match self {
            Source::F64 => f64::MAX,
            Source::F32 => f64::from(f32::MAX),
            Source::F16 => f64::from(f16::MAX),
            Source::BF16 => f64::from(bf16::MAX),
            Source::F8E4M3 => 448.0,
            Source::F8E5M2 => 57344.0,
        }
    }

    /// How many elements of a block are infinite.
    fn count_infinities(self, src: &[u8]) -> u64 {
        match self {
            Source::F64 => count(src, |b: [u8; 8]| f64::from_le_bytes(b).is_infinite()),
            Source::F32 => count(src, |b: [u8; 4]| f32::from_le_bytes(b).is_infinite()),
            Source::F16 => count(src, |b: [u8; 2]| u16::from_le_bytes(b) & 0x7FFF == F16_INF),
            Source::BF16 => count(src, |b: [u8; 2]| u16::from_le_bytes(b) & 0x7FFF == BF16_INF),
            Source::F8E4M3 => 0,
            Source::F8E5M2 => count(src, |[b]: [u8; 1]| b & 0x7F == 0x7C),
        }
    }
}

impl Target {
    pub(super) fn of(dtype: Dtype) -> Option<Target> {
        Some(match dtype {
            Dtype::F32 => Target::F32,
            Dtype::F16 => Target::F16,
            Dtype::BF16 => Target::BF16,
            _ => return None,
        })
    }

    /// The same dtype as a source: its size, largest finite value and infinities.
    fn source(self) -> Source {
        match self {
            Target::F32 => Source::F32,
            Target::F16 => Source::F16,
            Target::BF16 => Source::BF16,
        }
    }

    pub(super) fn size(self) -> usize {
        self.source().size()
    }

    /// Whether a block holds an infinity or a NaN: cheaper than the count, which most skip.
    fn any_non_finite(self, dst: &[u8]) -> bool {
        match self {
            Target::F32 => any(dst, |b: [u8; 4]| {
                u32::from_le_bytes(b) & 0x7FFF_FFFF >= 0x7F80_0000
            }),
            Target::F16 => any(dst, |b: [u8; 2]| u16::from_le_bytes(b) & 0x7FFF >= F16_INF),
            Target::BF16 => any(dst, |b: [u8; 2]| u16::from_le_bytes(b) & 0x7FFF >= BF16_INF),
        }
    }
}

/// The bits of F16 +inf.
const F16_INF: u16 = 0x7C00;
/// The bits of BF16 +inf.
const BF16_INF: u16 = 0x7F80;

/// Converts `src` into `dst` (as many elements) and returns how many finite values overflowed.
pub(super) fn run(source: Source, target: Target, src: &[u8], dst: &mut [u8]) -> u64 {
    let can_overflow = source.max_finite() > target.source().max_finite();
    let mut scratch = Scratch {
        values: [0.0; BLOCK],
        halves: [0; BLOCK],
    };
    let mut overflowed = 0;
    let src_blocks = src.chunks(BLOCK * source.size());
    let dst_blocks = dst.chunks_mut(BLOCK * target.size());
    for (src, dst) in src_blocks.zip(dst_blocks) {
        convert_block(source, target, src, dst, &mut scratch);
        if can_overflow {
            overflowed += overflow_in_block(source, target, src, dst);
        }
    }
    overflowed
}

/// Stack buffers for one block.
struct Scratch {
    /// The block decoded to `f32`.
    values: [f32; BLOCK],
    /// 16-bit elements staged for alignment (unaligned source or destination).
    halves: [u16; BLOCK],
}

fn convert_block(source: Source, target: Target, src: &[u8], dst: &mut [u8], s: &mut Scratch) {
    match (source, target) {
        (Source::F8E4M3, target) => f8::convert(&f8::E4M3, target, src, dst),
        (Source::F8E5M2, target) => f8::convert(&f8::E5M2, target, src, dst),
        // Widening to F32: decode straight into an aligned destination.
        (source, Target::F32) => match cast_mut::<f32>(dst) {
            Some(out) => decode_f32(source, src, out, &mut s.halves),
            None => {
                let values = decode_f32_block(source, src, &mut s.values, &mut s.halves);
                write_le(values.iter().map(|v| v.to_bits()), dst);
            }
        },
        (source, target) => {
            let values = decode_f32_block(source, src, &mut s.values, &mut s.halves);
            encode_f32(target, values, dst, &mut s.halves);
        }
    }
}

/// Counts the values of a block that were finite in `src` and are infinite in `dst`: infinities
/// map to infinities, so the difference of the two counts is the overflows.
///
/// NOTE: checking for a non-finite value costs a fraction of counting infinities, which costs
/// more than the conversion (BENCHMARKS.md, "convert/kernel.rs: overflow_in_block").
fn overflow_in_block(source: Source, target: Target, src: &[u8], dst: &[u8]) -> u64 {
    if !target.any_non_finite(dst) {
        return 0;
    }
    match target.source().count_infinities(dst) {
        0 => 0,
        out => out.saturating_sub(source.count_infinities(src)),
    }
}

/// Decodes a block into `values` (or borrows aligned F32) and returns the decoded part.
fn decode_f32_block<'a>(
    source: Source,
    src: &'a [u8],
    values: &'a mut [f32; BLOCK],
    stage: &mut [u16; BLOCK],
) -> &'a [f32] {
    if source == Source::F32 {
        if let Some(values) = cast::<f32>(src) {
            return values;
        }
    }
    let n = src.len() / source.size();
    let values = values.get_mut(..n).unwrap_or_default();
    decode_f32(source, src, values, stage);
    values
}

/// Decodes `src` into `out`, one `f32` per element (`stage` at least as long).
fn decode_f32(source: Source, src: &[u8], out: &mut [f32], stage: &mut [u16]) {
    match source {
        // `as` rounds to nearest even and overflows to infinity.
        Source::F64 => decode(src, out, |b: [u8; 8]| f64::from_le_bytes(b) as f32),
        Source::F32 => decode(src, out, f32::from_le_bytes),
        Source::F16 => {
            let halves: &[f16] = read_halves(src, stage);
            if let Some(out) = out.get_mut(..halves.len()) {
                halves.convert_to_f32_slice(out);
            }
        }
        // BF16 is the upper half of an F32: widening is a shift, exact for every pattern.
        Source::BF16 => {
            let halves: &[u16] = read_halves(src, stage);
            for (o, h) in out.iter_mut().zip(halves) {
                *o = f32::from_bits(u32::from(*h) << 16);
            }
        }
        Source::F8E4M3 => f8::decode_f32(&f8::E4M3, src, out),
        Source::F8E5M2 => f8::decode_f32(&f8::E5M2, src, out),
    }
}

/// Encodes `values` into `dst` (one 16-bit or 32-bit element per value).
fn encode_f32(target: Target, values: &[f32], dst: &mut [u8], stage: &mut [u16; BLOCK]) {
    match target {
        Target::F32 => match cast_mut::<f32>(dst) {
            Some(out) => {
                for (o, v) in out.iter_mut().zip(values) {
                    *o = *v;
                }
            }
            None => write_le(values.iter().map(|v| v.to_bits()), dst),
        },
        Target::F16 => encode_halves::<f16>(values, dst, stage),
        Target::BF16 => encode_halves::<bf16>(values, dst, stage),
    }
}

/// Encodes `values` as 16-bit floats `H` with `half`'s slice conversion (round to nearest
/// even, overflow to infinity): into `dst` when aligned, else staged, to stay vectorised.
///
/// NOTE: branch-free conversions of our own were no faster (BENCHMARKS.md,
/// "convert/kernel.rs: encode_halves").
fn encode_halves<H>(values: &[f32], dst: &mut [u8], stage: &mut [u16; BLOCK])
where
    H: bytemuck::Pod,
    [H]: HalfFloatSliceExt,
{
    match cast_mut::<H>(dst) {
        Some(out) => convert_from_f32(values, out),
        None => {
            let staged: &mut [H] =
                bytemuck::try_cast_slice_mut(stage.as_mut_slice()).unwrap_or_default();
            let n = values.len().min(staged.len());
            let staged = staged.get_mut(..n).unwrap_or_default();
            convert_from_f32(values, staged);
            write_le(staged.reinterpret_cast().iter().copied(), dst);
        }
    }
}

/// `half`'s slice conversion over the common length, so that its assertion cannot fire.
fn convert_from_f32<H>(values: &[f32], out: &mut [H])
where
    [H]: HalfFloatSliceExt,
{
    let n = values.len().min(out.len());
    if let (Some(values), Some(out)) = (values.get(..n), out.get_mut(..n)) {
        out.convert_from_f32_slice(values);
    }
}

/// The 16-bit elements of `src` as `H`: borrowed when aligned, else copied into `stage`.
fn read_halves<'a, H: bytemuck::Pod>(src: &'a [u8], stage: &'a mut [u16]) -> &'a [H] {
    if let Some(halves) = cast::<H>(src) {
        return halves;
    }
    let n = (src.len() / 2).min(stage.len());
    let staged = stage.get_mut(..n).unwrap_or_default();
    decode(src, staged, u16::from_le_bytes);
    // A 16-bit `Pod` has the size and alignment of `u16`: the cast cannot fail.
    bytemuck::try_cast_slice(staged).unwrap_or_default()
}

/// `bytes` as a slice of `T`, when aligned for it on a little-endian machine.
fn cast<T: bytemuck::Pod>(bytes: &[u8]) -> Option<&[T]> {
    if cfg!(target_endian = "little") {
        bytemuck::try_cast_slice(bytes).ok()
    } else {
        None
    }
}

/// The mutable twin of [`cast`].
pub(super) fn cast_mut<T: bytemuck::Pod>(bytes: &mut [u8]) -> Option<&mut [T]> {
    if cfg!(target_endian = "little") {
        bytemuck::try_cast_slice_mut(bytes).ok()
    } else {
        None
    }
}

/// Decodes each `N`-byte element of `src` into the matching slot of `out`.
pub(super) fn decode<const N: usize, T>(src: &[u8], out: &mut [T], f: impl Fn([u8; N]) -> T) {
    for (o, chunk) in out.iter_mut().zip(src.chunks_exact(N)) {
        *o = f(le(chunk));
    }
}

/// Writes each value little-endian into the matching slot of `dst`.
pub(super) fn write_le<V: LeBytes>(values: impl Iterator<Item = V>, dst: &mut [u8]) {
    for (chunk, v) in dst.chunks_exact_mut(V::SIZE).zip(values) {
        v.write_le(chunk);
    }
}

/// Counts the `N`-byte elements of `bytes` for which `f` holds.
fn count<const N: usize>(bytes: &[u8], f: impl Fn([u8; N]) -> bool) -> u64 {
    bytes
        .chunks_exact(N)
        .map(|chunk| u64::from(f(le(chunk))))
        .sum()
}

/// Whether `f` holds for any `N`-byte element: a fold, as `any`'s early exit stays scalar.
fn any<const N: usize>(bytes: &[u8], f: impl Fn([u8; N]) -> bool) -> bool {
    bytes
        .chunks_exact(N)
        .fold(false, |found, chunk| found | f(le(chunk)))
}

/// A chunk of `chunks_exact(N)` as an array (the fallback only keeps a panic path out).
fn le<const N: usize>(chunk: &[u8]) -> [u8; N] {
    <[u8; N]>::try_from(chunk).unwrap_or([0; N])
}

/// An unsigned element that can be written as little-endian bytes.
pub(super) trait LeBytes: Copy {
    const SIZE: usize;
    fn write_le(self, chunk: &mut [u8]);
}

macro_rules! le_bytes {
    ($($ty:ty),*) => {$(
        impl LeBytes for $ty {
            const SIZE: usize = size_of::<$ty>();
            fn write_le(self, chunk: &mut [u8]) {
                chunk.copy_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}

le_bytes!(u16, u32);
