//! The plan of a prefetch, as pure functions: chunks cut in checkpoint order, the split by bytes over ranks and readers, and the memory guard's choice of what to warm.

use std::ops::Range;

use super::queue::{DONE, FREE, SKIPPED};
use crate::extras::LocalRank;
use crate::report::SkipReason;

/// The memory guard warms at most this fraction of the memory available.
const GUARD_NUMERATOR: u64 = 9;
const GUARD_DENOMINATOR: u64 = 10;

/// A queue of more chunks than this gets larger chunks instead (32 MiB of
/// queue at most).
const MAX_CHUNKS: u64 = 1 << 22;

/// Chunks are at least this large (and a multiple of the page size).
const MIN_CHUNK: u64 = 64 << 10;

/// A run of one file's bytes: the unit of work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub file: usize,
    pub offset: u64,
    pub len: u64,
}

/// The chunk size for a checkpoint of `total` bytes: the request rounded up
/// to whole pages (at least 64 KiB), doubled until the queue has at most
/// 4 Mi chunks. The same inputs give the same size in every rank.
pub(crate) fn effective_chunk(total: u64, requested: u64, page: u64) -> u64 {
    let page = page.max(1);
    let mut chunk = requested.max(MIN_CHUNK).div_ceil(page).saturating_mul(page);
    while total.div_ceil(chunk.max(1)) > MAX_CHUNKS {
        chunk = chunk.saturating_mul(2);
    }
    chunk.max(1)
}

/// Cuts files of these lengths into chunks, in order.
pub(crate) fn plan_chunks(lens: &[u64], chunk: u64) -> Vec<Chunk> {
    let chunk = chunk.max(1);
    let mut out = Vec::new();
    for (file, &len) in lens.iter().enumerate() {
        let mut offset = 0;
        while offset < len {
            let this = chunk.min(len - offset);
            out.push(Chunk {
                file,
                offset,
                len: this,
            });
            offset += this;
        }
    }
    out
}

/// The chunks of a checkpoint: the same in every rank for the same files
/// and requested chunk size, which is what lets the ranks share one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChunkPlan {
    /// Bytes of all files.
    pub total: u64,
    /// The chunk size used ([`effective_chunk`]).
    pub chunk_size: u64,
    pub chunks: Vec<Chunk>,
}

impl ChunkPlan {
    /// Files of these lengths in chunks of about `requested` bytes, on a
    /// system with pages of `page` bytes.
    pub(crate) fn new(lens: &[u64], requested: u64, page: u64) -> ChunkPlan {
        let total = lens.iter().sum();
        let chunk_size = effective_chunk(total, requested, page);
        ChunkPlan {
            total,
            chunk_size,
            chunks: plan_chunks(lens, chunk_size),
        }
    }
}

/// Splits `chunks` into `parts` runs of about equal bytes: part `p` holds
/// the chunks that start in bytes `[p T / parts, (p + 1) T / parts)`.
pub(crate) fn split_by_bytes(chunks: &[Chunk], parts: usize) -> Vec<Range<usize>> {
    let parts = parts.max(1);
    let total: u64 = chunks.iter().map(|c| c.len).sum();
    let mut starts = Vec::with_capacity(chunks.len());
    let mut at = 0u64;
    for c in chunks {
        starts.push(at);
        at += c.len;
    }
    let boundary = |p: usize| -> u64 {
        let b = u128::from(total) * p as u128 / parts as u128;
        u64::try_from(b).unwrap_or(u64::MAX)
    };
    let mut out = Vec::with_capacity(parts);
    let mut first = 0usize;
    for p in 0..parts {
        let end_byte = boundary(p + 1);
        let mut end = first;
        while starts.get(end).is_some_and(|&s| s < end_byte) {
            end += 1;
        }
        if p + 1 == parts {
            end = chunks.len();
        }
        out.push(first..end);
        first = end;
    }
    out
}

/// Where each of a rank's readers starts, and which chunks it may claim:
/// with a shared queue, everything, readers spread over ranks × streams;
/// without, the rank's own share, its readers spread over it.
pub(crate) fn reader_plan(
    chunks: &[Chunk],
    rank: &LocalRank,
    streams: usize,
    shared: bool,
) -> (Range<usize>, Vec<usize>) {
    let streams = streams.max(1);
    if shared {
        let parts = split_by_bytes(chunks, rank.size.saturating_mul(streams));
        let starts = (0..streams)
            .map(|s| parts.get(rank.rank * streams + s).map_or(0, |r| r.start))
            .collect();
        return (0..chunks.len(), starts);
    }
    let mine = split_by_bytes(chunks, rank.size)
        .get(rank.rank)
        .cloned()
        .unwrap_or(0..0);
    let sub = chunks.get(mine.clone()).unwrap_or(&[]);
    let starts = split_by_bytes(sub, streams)
        .into_iter()
        .map(|r| mine.start + r.start)
        .collect();
    (mine, starts)
}

/// The memory guard's decision, over chunks in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Init {
    /// One word per chunk: free, done (resident), or skipped.
    pub states: Vec<u64>,
    /// Bytes resident when checked.
    pub resident: u64,
    /// Bytes not resident when checked.
    pub needed: u64,
    /// The memory available, where known.
    pub available: Option<u64>,
    /// The most the guard lets prefetch warm: 90 % of `available`.
    pub budget: Option<u64>,
    /// Bytes the guard leaves cold.
    pub skipped: u64,
    /// Whether residency could be checked.
    pub known: bool,
}

impl Init {
    /// The guard's decision in words, where it left bytes cold.
    pub(crate) fn guard_reason(&self, total: u64) -> Option<SkipReason> {
        if self.skipped == 0 {
            return None;
        }
        let (Some(available), Some(budget)) = (self.available, self.budget) else {
            return None;
        };
        Some(SkipReason::MemoryGuard {
            needed: self.needed,
            budget,
            available,
            resident: self.resident,
            total,
            skipped: self.skipped,
        })
    }
}

/// Applies the memory guard: chunks are warmed in order while the missing
/// bytes fit in 90 % of `available`; resident chunks are done; the rest is
/// skipped. `resident[i]`: chunk `i`'s resident bytes (0 where unknown).
pub(crate) fn guard(
    chunks: &[Chunk],
    resident: &[u64],
    available: Option<u64>,
    known: bool,
) -> Init {
    let budget = available.map(|a| {
        u64::try_from(u128::from(a) * u128::from(GUARD_NUMERATOR) / u128::from(GUARD_DENOMINATOR))
            .unwrap_or(u64::MAX)
    });
    let mut states = Vec::with_capacity(chunks.len());
    let (mut resident_total, mut needed, mut planned, mut skipped) = (0u64, 0u64, 0u64, 0u64);
    let mut over = false;
    for (i, c) in chunks.iter().enumerate() {
        let r = resident.get(i).copied().unwrap_or(0).min(c.len);
        let missing = c.len - r;
        resident_total += r;
        needed += missing;
        if missing == 0 {
            states.push(DONE);
            continue;
        }
        if !over && budget.is_none_or(|b| planned + missing <= b) {
            planned += missing;
            states.push(FREE);
        } else {
            over = true;
            skipped += missing;
            states.push(SKIPPED);
        }
    }
    Init {
        states,
        resident: resident_total,
        needed,
        available,
        budget,
        skipped,
        known,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_byte_once() {
        let lens = [10_000u64, 0, 4096, 12_289];
        let chunks = plan_chunks(&lens, 4096);
        for (file, &len) in lens.iter().enumerate() {
            let mut at = 0;
            for c in chunks.iter().filter(|c| c.file == file) {
                assert_eq!(c.offset, at);
                assert!(c.len > 0 && c.len <= 4096);
                at += c.len;
            }
            assert_eq!(at, len);
        }
        assert_eq!(effective_chunk(1 << 30, 8 << 20, 4096), 8 << 20);
        assert_eq!(effective_chunk(1 << 30, 1000, 4096), MIN_CHUNK);
        assert_eq!(
            effective_chunk(1 << 30, (1 << 20) + 1, 4096),
            (1 << 20) + 4096
        );
        // 64 PiB in 8 MiB chunks would be 8 Gi chunks: larger ones instead.
        let huge = effective_chunk(1 << 56, 8 << 20, 4096);
        assert!((1u64 << 56).div_ceil(huge) <= MAX_CHUNKS);
    }

    /// The naive twin of `split_by_bytes`: each chunk goes to the part its
    /// first byte falls in.
    fn naive_split(chunks: &[Chunk], parts: usize) -> Vec<usize> {
        let total: u64 = chunks.iter().map(|c| c.len).sum();
        let mut at = 0u64;
        chunks
            .iter()
            .map(|c| {
                let part = (0..parts)
                    .rev()
                    .find(|&p| u128::from(at) * parts as u128 >= u128::from(total) * p as u128)
                    .unwrap();
                at += c.len;
                part
            })
            .collect()
    }

    #[test]
    fn split_by_bytes_not_by_count() {
        // One big shard and many small ones: a split by file count would
        // give rank 0 almost everything.
        let lens = [64u64 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20];
        let chunks = plan_chunks(&lens, 8 << 20);
        for parts in 1..=5 {
            let split = split_by_bytes(&chunks, parts);
            assert_eq!(split.len(), parts);
            assert_eq!(split.first().unwrap().start, 0);
            assert_eq!(split.last().unwrap().end, chunks.len());
            for w in split.windows(2) {
                assert_eq!(w[0].end, w[1].start, "contiguous, disjoint");
            }
            let owner = naive_split(&chunks, parts);
            for (p, r) in split.iter().enumerate() {
                for i in r.clone() {
                    assert_eq!(owner[i], p, "chunk {i} with {parts} parts");
                }
            }
            let total: u64 = lens.iter().sum();
            for r in &split {
                let bytes: u64 = chunks[r.clone()].iter().map(|c| c.len).sum();
                assert!(
                    bytes <= total / parts as u64 + (8 << 20),
                    "{bytes} with {parts} parts"
                );
            }
        }
        assert_eq!(split_by_bytes(&[], 3), vec![0..0, 0..0, 0..0]);
    }

    #[test]
    fn readers_start_apart() {
        let chunks = plan_chunks(&[96 << 20], 8 << 20); // 12 chunks
        let rank = |r, s| LocalRank {
            rank: r,
            size: s,
            source: crate::report::RankSource::Alone,
        };
        let (range, starts) = reader_plan(&chunks, &rank(1, 3), 2, true);
        assert_eq!(range, 0..12);
        assert_eq!(starts, vec![4, 6]);
        let (range, starts) = reader_plan(&chunks, &rank(1, 3), 2, false);
        assert_eq!(range, 4..8);
        assert_eq!(starts, vec![4, 6]);
        let (range, starts) = reader_plan(&chunks, &rank(0, 1), 4, true);
        assert_eq!((range, starts), (0..12, vec![0, 3, 6, 9]));
    }

    #[test]
    fn guard_warms_a_prefix_within_budget() {
        let chunks = plan_chunks(&[40], 10); // 4 chunks of 10
        // Chunk 1 resident; 30 bytes needed; 90% of 25 is 22: two chunks fit.
        let init = guard(&chunks, &[0, 10, 0, 0], Some(25), true);
        assert_eq!(init.states, vec![FREE, DONE, FREE, SKIPPED]);
        assert_eq!((init.resident, init.needed, init.skipped), (10, 30, 10));
        assert_eq!(init.budget, Some(22));
        let why = init.guard_reason(40).unwrap();
        assert!(
            matches!(why, SkipReason::MemoryGuard { skipped: 10, .. }),
            "{why}"
        );
        assert!(why.to_string().starts_with("memory guard: "), "{why}");
        // Unknown memory: no limit.
        let init = guard(&chunks, &[0; 4], None, true);
        assert_eq!(init.states, vec![FREE; 4]);
        assert_eq!(init.guard_reason(40), None);
        // Partly resident chunks count what is missing.
        let init = guard(&chunks, &[5, 5, 5, 5], Some(23), true);
        assert_eq!(init.states, vec![FREE, FREE, FREE, FREE]);
        let init = guard(&chunks, &[5, 5, 5, 5], Some(22), true);
        assert_eq!(init.states, vec![FREE, FREE, FREE, SKIPPED]);
    }
}
