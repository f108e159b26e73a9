//! Every call into the operating system, with the platform's implementation chosen in this one place.
//!
//! Linux gets the real calls (`linux.rs`): page-cache advice and residency,
//! direct I/O, `statfs`, locks, process liveness, shared maps. Elsewhere
//! (`stub.rs`) reads work through the standard library and every hint is a
//! no-op or answers [`io::ErrorKind::Unsupported`], so that callers degrade
//! (mmap stays the default, prefetch reads instead of advising) rather than
//! fail. Safe wrappers come from `rustix` where it has one; the few calls it
//! lacks (`cachestat(2)`, `mincore(2)`) and the shared queue map are the only
//! `unsafe` here.

use std::fs::File;
use std::io;

#[cfg_attr(target_os = "linux", path = "linux.rs")]
#[cfg_attr(not(target_os = "linux"), path = "stub.rs")]
mod imp;

pub(crate) use imp::*;

/// The alignment direct I/O needs of offsets, lengths and buffers. 4 KiB
/// covers the logical block size of every common device.
pub(crate) const DIRECT_ALIGN: u64 = 4096;

/// `EINVAL`: what a filesystem answers a direct read it does not support.
pub(crate) const EINVAL: i32 = 22;

/// Reads into `buf` at `offset` until at least `required` bytes have
/// arrived (all of `buf` if the file is long enough), retrying short reads
/// and `EINTR`. On failure returns the offset that failed along with the
/// error; end-of-file before `required` bytes is `UnexpectedEof` (the file
/// shrank).
pub(crate) fn read_at_least(
    file: &File,
    buf: &mut [u8],
    required: usize,
    offset: u64,
) -> Result<(), (u64, io::Error)> {
    let mut done = 0usize;
    while done < buf.len() {
        let at = offset + done as u64;
        let Some(rest) = buf.get_mut(done..) else {
            break;
        };
        match pread(file, rest, at) {
            Ok(0) if done >= required => break,
            Ok(0) => {
                return Err((
                    at,
                    io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "file ended before the expected length",
                    ),
                ));
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err((at, e)),
        }
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes at `offset`; see [`read_at_least`].
pub(crate) fn read_exact_at(
    file: &File,
    buf: &mut [u8],
    offset: u64,
) -> Result<(), (u64, io::Error)> {
    let len = buf.len();
    read_at_least(file, buf, len, offset)
}
