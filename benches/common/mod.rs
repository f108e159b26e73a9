//! The harness every benchmark shares: options, child processes, statistics,
//! `/proc` figures and the seeded checkpoints; a benchmark keeps only its arms
//! and its table.
//!
//! A benchmark includes it with `mod common;` (this folder is not a target of
//! its own: Cargo only takes `benches/*.rs` and `benches/*/main.rs`).

// Each benchmark uses part of the harness.
#![allow(dead_code)]

pub mod args;
pub mod child;
pub mod data;
pub mod fuse;
pub mod node_memory;
pub mod proc;
pub mod stats;

/// The seeded byte generator the tests use too (see its module docs).
#[path = "../../tests/common/random.rs"]
pub mod random;

/// The order of the arms in round `round`: every arm once, rotated by one
/// each round, so that no arm always runs first (after the cache was
/// prepared). A rotation keeps the cyclic order: each arm follows the same
/// neighbour every round (the first arm of a round excepted).
pub fn rotated(arms: usize, round: usize) -> impl Iterator<Item = usize> {
    (0..arms).map(move |k| (k + round) % arms)
}

/// The order of the arms in round `round`: every arm once, in the given
/// order in round 0, then shuffled by a generator seeded with the round, so
/// that no arm always follows the same neighbour (which [`rotated`] keeps).
///
/// NOTE: on the development VM an arm that follows one which freed gigabytes
/// pays more for its own fresh memory: rotated, the remote benchmark's arm
/// after `fresh-memory` was the slowest in every round, whichever it was.
pub fn shuffled(arms: usize, round: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..arms).collect();
    // xorshift64*, seeded by the round: reproducible, no dependency.
    let mut state = (round as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    if round > 0 {
        for i in (1..arms).rev() {
            let j = (next() % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
    }
    order
}

/// Writes a benchmark's samples to `path` as JSON, with the checkpoint
/// (`root`, its file count and bytes) and the machine they were taken on.
pub fn write_samples(
    path: &std::path::Path,
    root: &std::path::Path,
    files: usize,
    bytes: u64,
    samples: &impl serde::Serialize,
) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let json = serde_json::json!({
        "checkpoint": root,
        "files": files,
        "bytes": bytes,
        "machine": proc::machine(),
        "samples": samples,
    });
    std::fs::write(
        path,
        serde_json::to_vec_pretty(&json).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("writing {}: {e}", path.display()))?;
    eprintln!("samples written to {}", path.display());
    Ok(())
}
