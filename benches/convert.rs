//! `cargo bench --bench convert`: the speed of `safeload::convert` on one
//! thread, next to `memcpy` of the same bytes.
//!
//! Generates the sources once in memory (seeded pseudo-random weights:
//! normal values at the scales of embeddings, projections and norms), then
//! times every arm in turn, the order rotated each round, for several
//! rounds. Prints a markdown table of medians with the min-max
//! spread: GB/s of source bytes, ns per element, and the time of a plain
//! `copy_from_slice` of as many source bytes and as many destination bytes.
//!
//! ```text
//! cargo bench --bench convert -- [--mib 256] [--rounds 5] [--arms bf16-f16,f32-bf16,..]
//! ```

use std::hint::black_box;
use std::time::Instant;

use clap::Parser;
use safeload::Dtype;
use safeload::convert::convert;

mod common;

use common::args;
use common::data::Words;
use common::stats::Spread;

/// One conversion to time.
struct Arm {
    name: &'static str,
    from: Dtype,
    to: Dtype,
    /// Byte offset of the source in its buffer: 1 makes every element unaligned.
    src_offset: usize,
}

const ARMS: [Arm; 7] = [
    arm("bf16-f16", Dtype::BF16, Dtype::F16, 0),
    arm("f32-bf16", Dtype::F32, Dtype::BF16, 0),
    arm("f32-f16", Dtype::F32, Dtype::F16, 0),
    arm("f8e4m3-bf16", Dtype::F8_E4M3, Dtype::BF16, 0),
    arm("f16-f32", Dtype::F16, Dtype::F32, 0),
    arm("bf16-f32", Dtype::BF16, Dtype::F32, 0),
    arm("bf16-f16-unaligned", Dtype::BF16, Dtype::F16, 1),
];

const fn arm(name: &'static str, from: Dtype, to: Dtype, src_offset: usize) -> Arm {
    Arm {
        name,
        from,
        to,
        src_offset,
    }
}

/// The speed of `safeload::convert` on one thread, next to `memcpy` (the
/// module docs of benches/convert.rs say how).
#[derive(Parser)]
#[command(name = "convert")]
struct Options {
    /// Source bytes per arm, MiB.
    #[arg(long, default_value_t = 256, value_parser = at_least_one)]
    mib: usize,
    #[arg(long, default_value_t = 5, value_parser = at_least_one)]
    rounds: usize,
    #[arg(long, value_delimiter = ',', default_values = ARMS.map(|a| a.name), value_parser = ARMS.map(|a| a.name))]
    arms: Vec<String>,
}

fn at_least_one(v: &str) -> Result<usize, String> {
    match v.parse() {
        Ok(0) => Err("must be at least 1".into()),
        n => n.map_err(|e| format!("{e}")),
    }
}

/// A uniform value in [0, 1) from 24 random bits.
fn uniform(words: &mut Words) -> f32 {
    (words.word() >> 40) as f32 / (1u64 << 24) as f32
}

/// Roughly normal (a sum of four uniforms), times a scale picked the way a
/// model's tensors spread: mostly small weights, some of order one.
fn weight(words: &mut Words) -> f32 {
    let normal = (uniform(words) + uniform(words) + uniform(words) + uniform(words) - 2.0) * 1.7;
    let scale = match words.word() % 10 {
        0 => 1.0,
        1..=3 => 0.1,
        _ => 0.02,
    };
    normal * scale
}

/// `bytes` bytes of `dtype` elements, after `offset` bytes of padding.
fn source(dtype: Dtype, bytes: usize, offset: usize, words: &mut Words) -> Vec<u8> {
    let mut out = vec![0u8; offset + bytes];
    let dst = &mut out[offset..];
    if dtype == Dtype::F8_E4M3 {
        // FP8 checkpoints are scaled to use the whole range: any byte but NaN.
        for b in dst.iter_mut() {
            *b = match words.word() as u8 {
                0x7F | 0xFF => 0x38,
                b => b,
            };
        }
        return out;
    }
    // Weights drawn as f32, converted block by block.
    const CHUNK: usize = 1 << 16;
    let mut values = vec![0f32; CHUNK];
    for piece in dst.chunks_mut(CHUNK * size(dtype)) {
        let n = piece.len() / size(dtype);
        for v in &mut values[..n] {
            *v = weight(words);
        }
        let f32_bytes: &[u8] = bytemuck::cast_slice(&values[..n]);
        convert(Dtype::F32, dtype, f32_bytes, piece).expect("generating a source");
    }
    out
}

/// Bytes per element.
fn size(dtype: Dtype) -> usize {
    dtype.bitsize() / 8
}

fn main() {
    let o: Options = args::parse();
    let arms: Vec<&Arm> = ARMS
        .iter()
        .filter(|a| o.arms.iter().any(|n| n == a.name))
        .collect();
    let src_bytes = o.mib << 20;
    let mut words = Words::new("convert");

    eprintln!("generating {} MiB per source dtype ...", o.mib);
    let sources: Vec<Vec<u8>> = arms
        .iter()
        .map(|a| source(a.from, src_bytes, a.src_offset, &mut words))
        .collect();
    let dst_bytes = |a: &Arm| src_bytes / size(a.from) * size(a.to);
    let max_dst = arms
        .iter()
        .map(|a| dst_bytes(a))
        .max()
        .unwrap_or(0)
        .max(src_bytes);
    // Written once before timing so that no arm pays for first-touch faults.
    let mut dst = vec![1u8; max_dst];
    let copy_src = vec![2u8; max_dst];

    // The copies to compare with: one per distinct size.
    let mut copy_sizes: Vec<usize> = arms
        .iter()
        .flat_map(|a| [src_bytes, dst_bytes(a)])
        .collect();
    copy_sizes.sort();
    copy_sizes.dedup();

    // Every sample in milliseconds.
    let run_arm = |i: usize, dst: &mut [u8]| -> f64 {
        let a = arms[i];
        let src = &sources[i][a.src_offset..];
        let out = &mut dst[..dst_bytes(a)];
        let start = Instant::now();
        let converted = convert(a.from, a.to, src, out).expect("converting");
        black_box((&converted, out));
        start.elapsed().as_secs_f64() * 1e3
    };
    let run_copy = |size: usize, dst: &mut [u8]| -> f64 {
        let start = Instant::now();
        dst[..size].copy_from_slice(&copy_src[..size]);
        black_box(&dst[..size]);
        start.elapsed().as_secs_f64() * 1e3
    };

    // One warm-up of each, then the rounds, every arm and copy in each round,
    // the order rotated so that no arm always runs after the same one.
    let jobs = arms.len() + copy_sizes.len();
    let run_job = |job: usize, dst: &mut [u8]| -> f64 {
        if job < arms.len() {
            run_arm(job, dst)
        } else {
            run_copy(copy_sizes[job - arms.len()], dst)
        }
    };
    for job in 0..jobs {
        run_job(job, &mut dst);
    }
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); jobs];
    for round in 0..o.rounds {
        eprintln!("round {}/{}", round + 1, o.rounds);
        for job in common::rotated(jobs, round) {
            samples[job].push(run_job(job, &mut dst));
        }
    }

    let ms: Vec<Spread> = samples.iter().map(|s| Spread::of(s)).collect();
    let copy_median = |size: usize| {
        let j = copy_sizes.iter().position(|&s| s == size).unwrap();
        ms[arms.len() + j].median
    };

    println!(
        "\n{} MiB of source per arm, one thread, medians of {} rounds (min-max)\n",
        o.mib, o.rounds
    );
    println!(
        "| conversion | source -> dest MiB | ms | GB/s of source | ns/element | memcpy of source bytes, ms | memcpy of dest bytes, ms |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (i, a) in arms.iter().enumerate() {
        let time = ms[i];
        let elements = src_bytes / size(a.from);
        let unaligned = if a.src_offset != 0 {
            " (unaligned source)"
        } else {
            ""
        };
        println!(
            "| {} -> {}{unaligned} | {} -> {} | {time:.1} | {:.2} | {:.3} | {:.1} | {:.1} |",
            a.from,
            a.to,
            src_bytes >> 20,
            dst_bytes(a) >> 20,
            src_bytes as f64 / time.median / 1e6,
            time.median * 1e6 / elements as f64,
            copy_median(src_bytes),
            copy_median(dst_bytes(a)),
        );
    }
    println!("\n| memcpy | ms | GB/s |");
    println!("|---|---|---|");
    for (j, &size) in copy_sizes.iter().enumerate() {
        let time = ms[arms.len() + j];
        println!(
            "| {} MiB | {time:.1} | {:.2} |",
            size >> 20,
            size as f64 / time.median / 1e6
        );
    }
}
