//! Which fetch blocks of each file the modelled remote has delivered, which it is fetching,
//! and which requests wait for them: pure bookkeeping, no clock and no threads.
//!
//! The read path asks [`Fetches::acquire`] for the blocks a `READ` touches. Blocks already
//! fetched let it through; a block nobody fetches yet is marked in flight and reported as
//! started, so that the caller schedules its completion one first-byte delay later; a block
//! already in flight is joined. A request that cannot go through is kept here until
//! [`Fetches::complete`] hands it back.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

/// Fetched blocks remembered per file. Past this the oldest is forgotten, and fetched again
/// if read again, as a remote reader's bounded cache would: 65,536 blocks are 2 TiB at the
/// default 32 MiB block, and the set stays within about 1 MiB per file whatever the block.
pub(crate) const MAX_FETCHED_PER_FILE: usize = 1 << 16;

/// The blocks of every file read so far, with the requests waiting for them (`W`).
#[derive(Debug)]
pub(crate) struct Fetches<W> {
    block: u64,
    files: HashMap<Arc<Path>, FileBlocks<W>>,
}

#[derive(Debug)]
struct FileBlocks<W> {
    blocks: HashMap<u64, Block<W>>,
    /// Fetched block indices, oldest first, to forget past [`MAX_FETCHED_PER_FILE`].
    fetched: VecDeque<u64>,
}

#[derive(Debug)]
enum Block<W> {
    /// Asked from the remote, not arrived yet; these requests wait for it.
    InFlight(Vec<W>),
    Fetched,
}

/// What [`Fetches::acquire`] decided for one request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Acquire<W> {
    /// Every block the range touches is fetched: serve the request now.
    Ready(W),
    /// The request is kept until a block it needs arrives.
    Wait {
        /// Blocks this request started fetching; the caller completes each one later.
        started: Vec<u64>,
        /// Whether the request found a fetch already in flight and waits for it.
        joined: bool,
    },
}

impl<W> Fetches<W> {
    /// Bookkeeping for blocks of `block` bytes (at least 1).
    pub(crate) fn new(block: u64) -> Self {
        Self {
            block: block.max(1),
            files: HashMap::new(),
        }
    }

    /// The block indices that bytes `range` of a file of `len` bytes touch. Bytes past the
    /// end need no fetch: the remote answers them with nothing.
    pub(crate) fn blocks(&self, range: Range<u64>, len: u64) -> Range<u64> {
        let end = range.end.min(len);
        if range.start >= end {
            return 0..0;
        }
        range.start / self.block..(end - 1) / self.block + 1
    }

    /// Lets `waiter`, a request for bytes `range` of `file` (`len` bytes long), through when
    /// every block it touches is fetched; otherwise starts fetching the blocks nobody fetches
    /// yet and keeps `waiter` until a block it needs arrives.
    pub(crate) fn acquire(
        &mut self,
        file: &Arc<Path>,
        range: Range<u64>,
        len: u64,
        waiter: W,
    ) -> Acquire<W> {
        let blocks = self.blocks(range, len);
        if blocks.is_empty() {
            return Acquire::Ready(waiter);
        }
        let entry = self
            .files
            .entry(Arc::clone(file))
            .or_insert_with(|| FileBlocks {
                blocks: HashMap::new(),
                fetched: VecDeque::new(),
            });
        let mut started = Vec::new();
        // The request waits on one block only; when that one arrives it comes back here and
        // waits again if another of its blocks is still in flight.
        let mut wait_on = None;
        for index in blocks {
            match entry.blocks.get(&index) {
                Some(Block::Fetched) => {}
                Some(Block::InFlight(_)) => wait_on = Some(index),
                None => {
                    entry.blocks.insert(index, Block::InFlight(Vec::new()));
                    started.push(index);
                    wait_on = Some(index);
                }
            }
        }
        let Some(wait_on) = wait_on else {
            return Acquire::Ready(waiter);
        };
        if let Some(Block::InFlight(waiters)) = entry.blocks.get_mut(&wait_on) {
            waiters.push(waiter);
        }
        let joined = started.is_empty();
        Acquire::Wait { started, joined }
    }

    /// Marks block `index` of `file` fetched and hands back the requests that waited for it.
    pub(crate) fn complete(&mut self, file: &Path, index: u64) -> Vec<W> {
        let Some(entry) = self.files.get_mut(file) else {
            return Vec::new();
        };
        let Some(block) = entry.blocks.get_mut(&index) else {
            return Vec::new();
        };
        let waiters = match std::mem::replace(block, Block::Fetched) {
            Block::InFlight(waiters) => waiters,
            Block::Fetched => return Vec::new(),
        };
        entry.fetched.push_back(index);
        while entry.fetched.len() > MAX_FETCHED_PER_FILE {
            if let Some(oldest) = entry.fetched.pop_front() {
                entry.blocks.remove(&oldest);
            }
        }
        waiters
    }

    /// Forgets every fetched block, so that the next read of each pays its fetch again.
    /// Blocks in flight stay in flight, with their waiters, and count as fetched when they
    /// arrive.
    pub(crate) fn forget_fetched(&mut self) {
        self.files.retain(|_, entry| {
            entry
                .blocks
                .retain(|_, block| matches!(block, Block::InFlight(_)));
            entry.fetched.clear();
            !entry.blocks.is_empty()
        });
    }

    /// Whether block `index` of `file` is fetched.
    #[cfg(test)]
    fn is_fetched(&self, file: &Path, index: u64) -> bool {
        self.files
            .get(file)
            .and_then(|entry| entry.blocks.get(&index))
            .is_some_and(|block| matches!(block, Block::Fetched))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn file(name: &str) -> Arc<Path> {
        Arc::from(Path::new(name))
    }

    fn wait(started: &[u64], joined: bool) -> Acquire<u32> {
        Acquire::Wait {
            started: started.to_vec(),
            joined,
        }
    }

    #[test]
    fn blocks_touched_by_a_range() {
        let f = Fetches::<()>::new(MIB);
        assert_eq!(f.blocks(0..1, 10 * MIB), 0..1);
        assert_eq!(f.blocks(0..MIB, 10 * MIB), 0..1);
        assert_eq!(f.blocks(MIB - 1..MIB + 1, 10 * MIB), 0..2);
        assert_eq!(f.blocks(3 * MIB..4 * MIB + 1, 10 * MIB), 3..5);
        // Empty, or wholly past the end: no fetch.
        assert_eq!(f.blocks(5..5, 10 * MIB), 0..0);
        assert_eq!(f.blocks(10 * MIB..11 * MIB, 10 * MIB), 0..0);
        // Clipped at the end of the file.
        assert_eq!(f.blocks(9 * MIB..12 * MIB, 9 * MIB + 1), 9..10);
        assert_eq!(f.blocks(0..u64::MAX, 0), 0..0);
    }

    #[test]
    fn first_read_fetches_later_reads_go_through() {
        let a = file("a");
        let mut f = Fetches::new(MIB);
        assert_eq!(f.acquire(&a, 0..4096, 10 * MIB, 1), wait(&[0], false));
        assert_eq!(f.complete(&a, 0), vec![1]);
        assert!(f.is_fetched(&a, 0));
        assert_eq!(f.acquire(&a, 4096..8192, 10 * MIB, 2), Acquire::Ready(2));
        // Another file has its own blocks.
        let b = file("b");
        assert_eq!(f.acquire(&b, 0..4096, 10 * MIB, 3), wait(&[0], false));
    }

    #[test]
    fn concurrent_readers_of_a_block_share_its_fetch() {
        let a = file("a");
        let mut f = Fetches::new(MIB);
        assert_eq!(f.acquire(&a, 0..4096, 10 * MIB, 1), wait(&[0], false));
        assert_eq!(f.acquire(&a, MIB / 2..MIB, 10 * MIB, 2), wait(&[], true));
        assert_eq!(f.acquire(&a, 100..200, 10 * MIB, 3), wait(&[], true));
        assert_eq!(f.complete(&a, 0), vec![1, 2, 3]);
        // Completing twice hands nothing back.
        assert_eq!(f.complete(&a, 0), Vec::<u32>::new());
    }

    #[test]
    fn a_read_across_blocks_fetches_each_missing_one() {
        let a = file("a");
        let mut f = Fetches::new(MIB);
        assert_eq!(f.acquire(&a, 0..10, 10 * MIB, 1), wait(&[0], false));
        f.complete(&a, 0);
        // Blocks 0 (fetched), 1 and 2 (new); it waits on the last one started.
        assert_eq!(
            f.acquire(&a, 0..2 * MIB + 1, 10 * MIB, 2),
            wait(&[1, 2], false)
        );
        assert_eq!(f.complete(&a, 1), Vec::<u32>::new());
        assert_eq!(f.complete(&a, 2), vec![2]);
        assert_eq!(f.acquire(&a, 0..3 * MIB, 10 * MIB, 2), Acquire::Ready(2));
    }

    #[test]
    fn a_request_handed_back_early_waits_again() {
        let a = file("a");
        let mut f = Fetches::new(MIB);
        assert_eq!(f.acquire(&a, MIB..MIB + 1, 10 * MIB, 1), wait(&[1], false));
        // Starts block 0, and waits on block 1, already in flight.
        assert_eq!(f.acquire(&a, 0..MIB + 1, 10 * MIB, 2), wait(&[0], false));
        assert_eq!(f.complete(&a, 1), vec![1, 2]);
        // Request 2 is back before its block 0 arrived: it waits for that one now.
        assert_eq!(f.acquire(&a, 0..MIB + 1, 10 * MIB, 2), wait(&[], true));
        assert_eq!(f.complete(&a, 0), vec![2]);
        assert_eq!(f.acquire(&a, 0..MIB + 1, 10 * MIB, 2), Acquire::Ready(2));
    }

    #[test]
    fn forget_fetched_makes_blocks_cold_but_keeps_fetches_in_flight() {
        let a = file("a");
        let mut f = Fetches::new(MIB);
        f.acquire(&a, 0..1, 10 * MIB, 1);
        f.complete(&a, 0);
        assert_eq!(f.acquire(&a, MIB..MIB + 1, 10 * MIB, 2), wait(&[1], false));
        f.forget_fetched();
        assert!(!f.is_fetched(&a, 0));
        assert_eq!(f.acquire(&a, 0..1, 10 * MIB, 3), wait(&[0], false));
        // Block 1 was in flight through the forget: it still arrives, with its waiter.
        assert_eq!(f.complete(&a, 1), vec![2]);
        assert!(f.is_fetched(&a, 1));
    }

    #[test]
    fn fetched_blocks_per_file_are_bounded() {
        let a = file("a");
        let mut f = Fetches::new(1);
        let len = MAX_FETCHED_PER_FILE as u64 + 10;
        for i in 0..len {
            f.acquire(&a, i..i + 1, len, ());
            f.complete(&a, i);
        }
        let entry = &f.files[&a];
        assert_eq!(entry.blocks.len(), MAX_FETCHED_PER_FILE);
        assert_eq!(entry.fetched.len(), MAX_FETCHED_PER_FILE);
        // The oldest went first.
        assert!(!f.is_fetched(&a, 9));
        assert!(f.is_fetched(&a, 10));
        assert!(f.is_fetched(&a, len - 1));
    }
}
