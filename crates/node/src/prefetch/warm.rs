//! Warming one chunk of a file in the page cache: read through it in scratch-sized steps, or asked for with `WILLNEED` and waited for, what does not arrive read.

use std::fs::File;
use std::time::{Duration, Instant};

use super::plan::Chunk;
use super::residency::Target;
use crate::error::{Error, Operation, Result};
use crate::os;

/// After `WILLNEED`, the residency of a chunk is polled this often, and the
/// rest is read when nothing has landed for `WILLNEED_IDLE`.
const WILLNEED_POLL: Duration = Duration::from_micros(500);
const WILLNEED_IDLE: Duration = Duration::from_millis(50);

/// The largest read of the `Pread` method: one scratch buffer per reader.
const SCRATCH: usize = 8 << 20;

/// Reads a chunk through the page cache into a scratch buffer, in reads of
/// at most 8 MiB. A file that ends early ends the chunk (the load reports
/// the truncation).
pub(super) fn read_chunk(
    target: &Target,
    file: &File,
    chunk: Chunk,
    scratch: &mut Vec<u8>,
) -> Result<()> {
    let range = chunk.offset..chunk.offset + chunk.len;
    os::read_in_steps(range, scratch, SCRATCH, |buf, at| {
        os::read_at_least(file, buf, 0, at)
    })
    .map_err(|(at, e)| Error::io(Operation::Prefetch, &target.path, Some(at), e))
}

/// Asks for a chunk with `WILLNEED` in pieces the kernel honours whole,
/// waits while its pages arrive (calling `progress` as they do), and reads
/// what has not arrived once nothing has for a while (the kernel may drop
/// read-ahead under load).
pub(super) fn advise_and_wait(
    target: &Target,
    chunk: Chunk,
    scratch: &mut Vec<u8>,
    pages: &mut Vec<u8>,
    progress: &dyn Fn(),
) -> Result<()> {
    let end = chunk.offset + chunk.len;
    let piece = target.advice_piece.max(1);
    let mut offset = chunk.offset;
    while offset < end {
        let len = piece.min(end - offset);
        if os::advise_willneed(&target.file, offset, len).is_err() {
            return read_chunk(target, &target.file, chunk, scratch);
        }
        offset += len;
    }
    let mut last = 0;
    let mut last_change = Instant::now();
    loop {
        match target.landed(chunk.offset, chunk.len, pages) {
            Some(r) if r >= chunk.len => return Ok(()),
            Some(r) if r > last => {
                last = r;
                last_change = Instant::now();
                progress();
            }
            Some(_) if last_change.elapsed() < WILLNEED_IDLE => {}
            _ => return read_chunk(target, &target.file, chunk, scratch),
        }
        std::thread::sleep(WILLNEED_POLL);
    }
}
