//! The one pseudo-random byte generator of the tests and the benchmarks: the
//! same bytes on every run and machine, different for every seed.
//!
//! Plain `std`, so that a benchmark can include this file alone
//! (`#[path = "../tests/common/random.rs"] mod random;`) without the rest of
//! the test helpers. Tests reach it through `common` (`bytes_for` is
//! re-exported there).
//!
//! The bytes are part of the fixtures: the fuzz seed corpus
//! (`fuzz/corpus/seed-header/`) is built from them and compared byte for byte
//! by `tests/it/malformed/`, and the benchmark's cached checkpoint is keyed by
//! a version of them (`DATA_VERSION` in `benches/load.rs`). Changing the
//! sequence means rewriting the corpus and bumping that version.
// Each test binary and benchmark uses a part of it.
#![allow(dead_code)]

/// Fills `out` from xorshift64 (Marsaglia, "Xorshift RNGs", 2003: shifts 13,
/// 7, 17) started at `seed`, one step per byte, each byte the low 8 bits of
/// the state.
///
/// NOTE: a step per byte, not a 64-bit word per step (8 bytes of the state),
/// because the tests' fixtures and the fuzz seed corpus are these bytes.
/// Measured on the project's 2-core VM (2026-12-01, 640 MiB already faulted
/// in, release build, 3 rounds): 3.8-5.3 ns a byte, against 0.6-0.7 ns a byte
/// for a word per step; some 10 s more for the benchmark's default 2.2 GiB,
/// which is written once and cached. The tests' files are a few MiB.
///
/// # Panics
///
/// If `seed` is 0, from which xorshift never leaves 0.
pub fn fill(seed: u64, out: &mut [u8]) {
    assert_ne!(seed, 0, "xorshift64 stays at 0 from a seed of 0");
    let mut state = seed;
    for byte in out {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        *byte = state as u8;
    }
}

/// A seed for `name`: its 64-bit FNV-1a hash, so that names that differ in
/// one byte get unrelated bytes.
pub fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// `len` bytes that differ by name and position: `fill` from `seed_of(name)`.
pub fn bytes_for(name: &str, len: usize) -> Vec<u8> {
    let mut bytes = vec![0; len];
    fill(seed_of(name), &mut bytes);
    bytes
}
