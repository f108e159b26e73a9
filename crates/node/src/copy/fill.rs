//! Filling a node copy with the other ranks: the chunk queue's reads, straight into the copy's memory files, with `O_DIRECT` where the policy reads the file so.

use std::fs::File;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::ask::{Remarks, Wanted, find};
use super::coordinate::{Coordination, Obtained};
use super::handoff::Offer;
use crate::dest::node::CopyFill;
use crate::dest::pages::HugePages;
use crate::error::Error;
use crate::error::Operation;
use crate::extras::{ShareFile, direct_reads, tensor_part};
use crate::os;
use crate::prefetch;
use crate::source::read_error;

/// Fills `copy` through the chunk queue with the other ranks (alone where
/// `private`: a holder did not hand the key's copy over, so never through
/// the key's queue file), calling `complete` once every chunk is in place:
/// per file of the offer, what this rank read of it.
pub(super) fn fill(
    node: &Coordination<'_>,
    copy: &Obtained,
    private: bool,
    complete: &dyn Fn(),
) -> crate::error::Result<(Vec<ReadHere>, prefetch::FillOutcome)> {
    let Coordination {
        files,
        ask,
        chunk_size,
        key,
        ..
    } = *node;
    let (offer, dir) = (&copy.offer, node.dir.as_path());
    let parts = parts_of_offer(files, offer, &copy.memfds, copy.huge_pages)?;
    let lens: Vec<u64> = parts.iter().map(|part| part.file.size()).collect();
    // Direct reads where the policy would read the file so (FUSE, cold): the
    // daemon answers in requests of its `max_read`, not 128 KiB, and no page
    // cache copy is left behind. NOTE: the slowest of 3 ranks on the 2 ms test
    // mount kept closer to one rank alone so (BENCHMARKS.md, "node/fill.rs:
    // fill"). Chunks are whole pages of a page-aligned map; a last, partial
    // block goes through the OS layer's bounce buffer.
    let _direct = direct_reads(parts.iter().filter_map(|p| p.file.local()), ask.direct_io);
    let read = |k: usize, offset: u64, len: u64, beat: &dyn Fn()| -> crate::error::Result<()> {
        parts
            .get(k)
            .map_or(Ok(()), |part| part.read(offset, len, beat))
    };
    let material = queue_material(key);
    let streams = ask.streams.map_or(super::STREAMS, |s| s.max(1));
    // A rank that took the copy unfinished just before the last filler
    // offered it complete finds it complete here (asked under the queue's
    // lock, each holder bounded, `ask.rs`). Only this copy (its maker's)
    // counts: another complete copy holds none of this one's bytes.
    let done_elsewhere = || {
        find(&node.asking(), Wanted::Complete, &mut Remarks::default())
            .0
            .is_some_and(|((found, _), _)| found.maker == offer.maker)
    };
    let shared = prefetch::SharedQueue {
        key_material: &material,
        dir,
        chunk_size,
        streams,
        complete,
        done_elsewhere: &done_elsewhere,
        private,
    };
    let outcome = prefetch::fill_shared(&lens, &shared, ask.rank, &read, ask.progress, ask.cancel)?;
    check_lengths(&parts)?;
    Ok((parts.into_iter().map(Part::counts).collect(), outcome))
}

/// The most bytes one read of a chunk asks for: the rank beats its heartbeat
/// after each piece, so a chunk read slowly but surely is never taken over.
///
/// NOTE: FUSE splits a direct read into 1 MiB requests anyway (`testfs`, as
/// hf-mount) and a disk into its own limit, so 2 MiB pieces cost nothing.
const PIECE: u64 = 2 << 20;

/// What this rank read of one file of the copy.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ReadHere {
    /// Chunks this rank read.
    pub chunks: usize,
    /// Bytes of tensor data in them.
    pub bytes: u64,
}

/// One file of the offer as the fill sees it: the file, the writer of its
/// copy, and what this rank read of it (as [`ReadHere`]).
struct Part<'a> {
    file: ShareFile<'a>,
    writer: CopyFill,
    chunks: AtomicUsize,
    bytes: AtomicU64,
}

impl Part<'_> {
    /// Reads `len` bytes at `offset` of the file into its copy, in pieces
    /// of [`PIECE`] with a `beat` after each, and counts them.
    fn read(&self, offset: u64, len: u64, beat: &dyn Fn()) -> crate::error::Result<()> {
        let file = self.file;
        let mut at = offset;
        while at < offset + len {
            let piece = PIECE.min(offset + len - at);
            self.writer
                .read_chunk(file.source(), at, piece)
                .map_err(|(at, e)| {
                    read_error(Operation::Read, file.source(), file.size(), at, e)
                })?;
            beat();
            at += piece;
        }
        self.chunks.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(
            tensor_part(file.header().data_start, offset, len),
            Ordering::Relaxed,
        );
        Ok(())
    }

    /// What this rank read of the file.
    fn counts(self) -> ReadHere {
        ReadHere {
            chunks: self.chunks.into_inner(),
            bytes: self.bytes.into_inner(),
        }
    }
}

/// The offer's files among `files`, in its order, each with a writer of its
/// copy (its pages faulted in as `huge_pages` says).
fn parts_of_offer<'a>(
    files: &[ShareFile<'a>],
    offer: &Offer,
    memfds: &[File],
    huge_pages: HugePages,
) -> crate::error::Result<Vec<Part<'a>>> {
    let mut parts = Vec::with_capacity(offer.files.len());
    for (&(i, _), memfd) in offer.files.iter().zip(memfds) {
        let Some(&file) = usize::try_from(i).ok().and_then(|i| files.get(i)) else {
            continue;
        };
        let writer = CopyFill::new(memfd, huge_pages)
            .map_err(|e| Error::io(Operation::Map, file.path(), None, e))?;
        parts.push(Part {
            file,
            writer,
            chunks: AtomicUsize::new(0),
            bytes: AtomicU64::new(0),
        });
    }
    Ok(parts)
}

/// The fill queue's key material: the copy's key, and the user (another
/// user's queue of the same copy is not this one's to join).
fn queue_material(key: u64) -> Vec<u8> {
    let uid = os::effective_uid().unwrap_or(u32::MAX);
    [
        &key.to_le_bytes()[..],
        &uid.to_le_bytes(),
        b"node copy queue",
    ]
    .concat()
}

/// Checks that each local file is still of the length it was opened at (a
/// remote object's every request required the version opened).
fn check_lengths(parts: &[Part<'_>]) -> crate::error::Result<()> {
    for part in parts {
        let (f, expected) = (part.file, part.file.size());
        let Some(local) = f.local() else {
            continue;
        };
        let now = local
            .len_now()
            .map_err(|e| Error::io(Operation::Stat, f.path(), None, e))?;
        if now != expected {
            let kind = crate::error::ErrorKind::SizeMismatch {
                expected,
                actual: now,
            };
            return Err(Error::new(kind, f.path()));
        }
    }
    Ok(())
}
