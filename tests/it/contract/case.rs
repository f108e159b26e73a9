//! The checkpoints the contract runs on, and the reference every API is held to: the
//! `safetensors` crate's own deserialization of the files, and naive twins of slicing,
//! splitting and converting its bytes.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use proptest::prelude::*;
use proptest::sample::select;
use safetensors::Dtype;

use crate::common::*;

const MIB: usize = 1 << 20;

/// The tensor sizes drawn, in bytes: around a 4 KiB page and a 2 MiB huge page, where a
/// buffer's rounding would show.
pub const SIZES: [usize; 7] = [0, 1, 4095, 4097, 2 * MIB - 1, 2 * MIB + 1, 3 * MIB + 4];

/// One checkpoint: its tensors, how many files they are cut into and which file each
/// goes to, and the seed of everything the APIs pick at random (the order tensors are
/// asked for, slices, ranks, the dtype a load converts to).
#[derive(Clone)]
pub struct Case {
    pub tensors: Vec<Spec>,
    /// The file of each tensor, `0..shards`.
    pub file_of: Vec<usize>,
    pub shards: usize,
    pub seed: u64,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The bytes follow from the names (`bytes_for`): the rest says the whole case.
        let tensors: Vec<String> = self
            .tensors
            .iter()
            .zip(&self.file_of)
            .map(|(t, file)| format!("{} {:?} {:?} in file {file}", t.name, t.dtype, t.shape))
            .collect();
        f.debug_struct("Case")
            .field("tensors", &tensors)
            .field("shards", &self.shards)
            .field("seed", &self.seed)
            .finish()
    }
}

/// A tensor of `dtype` whose bytes are close to `target`: the element count odd where
/// the dtype allows (a sub-byte dtype needs a count that ends on a byte), shaped as one
/// dimension, or two (`split` picks how), or none for a single element.
pub fn sized(name: &str, dtype: Dtype, target: usize, split: u8) -> Spec {
    let bits = dtype.bitsize();
    let mut count = target * 8 / bits;
    if bits % 8 == 0 {
        if count > 1 && count % 2 == 0 {
            count -= 1;
        }
    } else {
        // 4-bit types need an even count, 6-bit ones a multiple of 4.
        let step = 8 / gcd(bits, 8);
        count -= count % step;
    }
    let shape = match (count, split % 4) {
        (0, 0) => vec![0],
        (0, 1) => vec![3, 0],
        (0, _) => vec![0, 5],
        (1, 0) if bits % 8 == 0 => vec![],
        (n, 1 | 2) => {
            // Two dimensions: the smallest factor above 1 (the count is odd, so often 3
            // or 5), first or last.
            let f = (2..=64).find(|f| n % f == 0 && n / f > 1).unwrap_or(1);
            if split % 4 == 1 {
                vec![f, n / f]
            } else {
                vec![n / f, f]
            }
        }
        (n, _) => vec![n],
    };
    spec(name, dtype, &shape)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// A case every run checks first: each size once, in the dtypes an engine converts, in
/// two files, with a BERT-like 1536 x 385 F32 weight (2,365,440 bytes) and a 3 MiB F16
/// one.
pub fn corner_case() -> Case {
    let dtypes = [
        Dtype::U8,
        Dtype::F16,
        Dtype::BF16,
        Dtype::F32,
        Dtype::F64,
        Dtype::F8_E4M3,
        Dtype::I64,
    ];
    let mut tensors: Vec<Spec> = SIZES
        .iter()
        .zip(dtypes)
        .enumerate()
        .map(|(i, (&size, dtype))| sized(&format!("corner.{i}"), dtype, size, i as u8))
        .collect();
    tensors.push(spec("corner.bert", Dtype::F32, &[1536, 385]));
    tensors.push(spec("corner.f16", Dtype::F16, &[3, 524_289]));
    tensors.push(sized("corner.f4", Dtype::F4, 2 * MIB + 1, 1));
    let file_of = (0..tensors.len()).map(|i| (i * 7 + 1) % 2).collect();
    Case {
        tensors,
        file_of,
        shards: 2,
        seed: 0x5afe_10ad,
    }
}

/// Random cases: 1 to 5 tensors of any dtype and size of [`SIZES`], in 1 to 4 files,
/// assigned at random (so a file's order is not the names' order).
pub fn arb_case() -> impl Strategy<Value = Case> {
    (
        1usize..=4,
        proptest::collection::vec(
            (
                select(ALL_DTYPES.to_vec()),
                select(SIZES.to_vec()),
                any::<u8>(),
                any::<u8>(),
            ),
            1..=5,
        ),
        any::<u64>(),
    )
        .prop_map(|(shards, drawn, seed)| {
            let mut tensors = Vec::new();
            let mut file_of = Vec::new();
            for (i, (dtype, size, split, file)) in drawn.into_iter().enumerate() {
                let name = format!("t{i}.{}", format!("{dtype:?}").to_lowercase());
                tensors.push(sized(&name, dtype, size, split));
                file_of.push(usize::from(file) % shards);
            }
            Case {
                tensors,
                file_of,
                shards,
                seed,
            }
        })
}

impl Case {
    /// Writes the case into `dir` with the reference serializer: `model.safetensors` for
    /// one file, else numbered shards and their index (a file no tensor went to holds
    /// none). Returns the files.
    pub fn write(&self, dir: &Path) -> Vec<PathBuf> {
        if self.shards == 1 {
            return vec![write_single(dir, &self.tensors)];
        }
        let mut weight_map = serde_json::Map::new();
        let mut files = Vec::new();
        for shard in 0..self.shards {
            let name = shard_name(shard, self.shards);
            let group: Vec<Spec> = self
                .tensors
                .iter()
                .zip(&self.file_of)
                .filter(|(_, f)| **f == shard)
                .map(|(t, _)| t.clone())
                .collect();
            write_file(&dir.join(&name), &group, Some(metadata()));
            for t in &group {
                weight_map.insert(t.name.clone(), name.clone().into());
            }
            files.push(dir.join(name));
        }
        write_index(dir, serde_json::json!({ "weight_map": weight_map }));
        files
    }
}

/// What the `safetensors` crate reads from the files: every tensor by name.
pub struct Reference {
    pub tensors: BTreeMap<String, Spec>,
}

impl Reference {
    /// Parses every `*.safetensors` file directly in `dir`.
    pub fn of_dir(dir: &Path) -> Reference {
        let mut tensors = BTreeMap::new();
        for file in shards_of(dir) {
            let bytes = std::fs::read(&file).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            for (name, view) in st.tensors() {
                let spec = Spec {
                    name: name.clone(),
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    data: view.data().to_vec(),
                };
                tensors.insert(name, spec);
            }
        }
        Reference { tensors }
    }
}

// ---------------------------------------------------------------------------
// Naive twins.

/// The bytes of `spec` restricted to `ranges` (one per leading dimension, the rest whole),
/// row-major: one element at a time. `None` for a sub-byte dtype.
pub fn naive_slice(spec: &Spec, ranges: &[Range<usize>]) -> Option<Vec<u8>> {
    let size = spec.dtype.bitsize() / 8;
    if spec.dtype.bitsize() % 8 != 0 {
        return None;
    }
    let shape = &spec.shape;
    let full: Vec<Range<usize>> = (0..shape.len())
        .map(|d| ranges.get(d).cloned().unwrap_or(0..shape[d]))
        .collect();
    let mut out = Vec::new();
    if full.iter().any(|r| r.is_empty()) {
        return Some(out);
    }
    let mut index: Vec<usize> = full.iter().map(|r| r.start).collect();
    loop {
        let flat = index
            .iter()
            .zip(shape)
            .fold(0usize, |acc, (&i, &d)| acc * d + i);
        out.extend_from_slice(&spec.data[flat * size..(flat + 1) * size]);
        // The next index, the last dimension fastest.
        let mut d = index.len();
        loop {
            if d == 0 {
                return Some(out);
            }
            d -= 1;
            index[d] += 1;
            if index[d] < full[d].end {
                break;
            }
            index[d] = full[d].start;
        }
    }
}

/// The ranges of rank `rank`'s part of `shape` split `world` ways along `dim`, as
/// `torch.tensor_split` cuts it.
pub fn naive_shard(shape: &[usize], dim: usize, rank: usize, world: usize) -> Vec<Range<usize>> {
    let len = shape[dim];
    let (q, r) = (len / world, len % world);
    let start = rank * q + rank.min(r);
    let size = q + usize::from(rank < r);
    let mut ranges: Vec<Range<usize>> = shape[..dim].iter().map(|&d| 0..d).collect();
    ranges.push(start..start + size);
    ranges
}

/// The values of a float tensor as `f32`, one element at a time, for the dtypes
/// `Tensor::to_f32` and the conversions read.
pub fn naive_f32(dtype: Dtype, data: &[u8]) -> Option<Vec<f32>> {
    let values = match dtype {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        Dtype::F64 => data
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F8_E5M2 => data
            .iter()
            .map(|&b| f16::from_bits(u16::from(b) << 8).to_f32())
            .collect(),
        Dtype::F8_E4M3 => data.iter().map(|&b| e4m3(b)).collect(),
        _ => return None,
    };
    Some(values)
}

/// One F8_E4M3 (the "FN" variant: no infinities, one NaN per sign) as `f32`.
fn e4m3(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (exp, man) = (i32::from((b >> 3) & 0xf), f32::from(b & 7));
    if exp == 15 && man == 7.0 {
        return f32::NAN;
    }
    let value = if exp == 0 {
        man / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    };
    sign * value
}

/// `Loader::dtype(to)` of a tensor of `from`, one element at a time: through `f32`, then
/// rounded to nearest even by `half`. `None` where the tensor stays as it is (the same
/// dtype, or a dtype the conversion does not read).
pub fn naive_convert(from: Dtype, to: Dtype, data: &[u8]) -> Option<Vec<u8>> {
    if from == to || !matches!(to, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
        return None;
    }
    let values = naive_f32(from, data)?;
    Some(match to {
        Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::F16 => values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        _ => values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
    })
}

/// Whether two little-endian float buffers of `dtype` are the same values: equal bits, or
/// both NaN (a NaN's payload is not part of the contract). The first difference, where
/// there is one.
pub fn same_floats(dtype: Dtype, got: &[u8], want: &[u8]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} bytes where {} are", got.len(), want.len()));
    }
    let size = dtype.bitsize() / 8;
    let is_nan = |c: &[u8]| match dtype {
        Dtype::F32 => f32::from_le_bytes(c.try_into().unwrap()).is_nan(),
        Dtype::F16 => f16::from_le_bytes([c[0], c[1]]).is_nan(),
        Dtype::BF16 => bf16::from_le_bytes([c[0], c[1]]).is_nan(),
        _ => false,
    };
    for (i, (g, w)) in got.chunks(size).zip(want.chunks(size)).enumerate() {
        if g != w && !(is_nan(g) && is_nan(w)) {
            return Err(format!("element {i}: {g:02x?} where {w:02x?} is"));
        }
    }
    Ok(())
}

/// `f32` values compared as [`same_floats`] compares bytes.
pub fn same_f32(got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} values where {} are", got.len(), want.len()));
    }
    match got
        .iter()
        .zip(want)
        .position(|(g, w)| g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan()))
    {
        Some(i) => Err(format!("value {i}: {} where {} is", got[i], want[i])),
        None => Ok(()),
    }
}

/// A small deterministic generator for the APIs' random picks (xorshift64).
pub struct Picks(u64);

impl Picks {
    pub fn new(seed: u64) -> Picks {
        Picks(seed | 1)
    }

    /// A number in `0..n` (0 for `n == 0`).
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        if n == 0 {
            0
        } else {
            (self.0 % n as u64) as usize
        }
    }

    /// A range within `0..len`, possibly empty.
    pub fn range(&mut self, len: usize) -> Range<usize> {
        let a = self.below(len + 1);
        let b = self.below(len + 1);
        a.min(b)..a.max(b)
    }

    /// `items` in a random order.
    pub fn shuffled<T: Clone>(&mut self, items: &[T]) -> Vec<T> {
        let mut out = items.to_vec();
        for i in (1..out.len()).rev() {
            out.swap(i, self.below(i + 1));
        }
        out
    }
}
