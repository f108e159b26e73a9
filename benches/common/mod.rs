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
/// prepared) or always after the same neighbour.
pub fn rotated(arms: usize, round: usize) -> impl Iterator<Item = usize> {
    (0..arms).map(move |k| (k + round) % arms)
}
