//! One job run by a reader: a positional read into its place, a conversion read through the reader's scratch buffer, a populate of a map and the real cause of its failure.

use std::fs::File;
use std::io;

use super::{ConvertSource, Job, Outcome};
use crate::os;

/// The real cause of a failed populate: `MADV_POPULATE_READ` answers
/// `EFAULT` whatever the reason (EIO, a truncated file, a dead FUSE daemon),
/// so the range is read with `pread` for the filesystem's error and offset.
fn why_populate_failed(file: &File, offset: u64, len: usize, error: io::Error) -> (u64, io::Error) {
    const EFAULT: i32 = 14;
    if error.raw_os_error() != Some(EFAULT) {
        return (offset, error);
    }
    let end = offset + len as u64;
    match os::read_in_steps(offset..end, &mut Vec::new(), 1 << 20, |buf, at| {
        os::read_exact_at(file, buf, at)
    }) {
        Err(failure) => failure,
        Ok(()) => (offset, error),
    }
}

thread_local! {
    /// A reader's buffer for the source bytes of conversions, reused, so a
    /// converting load faults in no memory but its destinations.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs one job.
pub(super) fn execute<'a>(job: Job<'a>) -> Result<Outcome<'a>, (u64, io::Error)> {
    let bytes = job.bytes();
    match job {
        Job::Read {
            file,
            direct: _,
            offset,
            dst,
            required,
            hashed,
        } => {
            file.read_at(dst, required, offset)?;
            // The bytes are in place and no reader writes them again.
            let filled: &'a [u8] = dst;
            Ok(Outcome {
                landed: hashed.then(|| (offset, filled.get(..required).unwrap_or(filled))),
                overflowed: 0,
                bytes,
            })
        }
        Job::Convert {
            source,
            from,
            to,
            dst,
        } => {
            let converted = match source {
                ConvertSource::Mapped(src) => crate::convert::convert(from, to, src, dst),
                ConvertSource::File { file, offset, len } => SCRATCH.with(|scratch| {
                    let mut scratch = scratch.borrow_mut();
                    scratch.resize(len, 0);
                    let src = scratch.get_mut(..len).unwrap_or_default();
                    file.read_at(src, len, offset)
                        .map(|()| crate::convert::convert(from, to, src, dst))
                })?,
            };
            let converted = converted.map_err(|e| (0, io::Error::other(e.to_string())))?;
            Ok(Outcome {
                landed: None,
                overflowed: converted.overflowed(),
                bytes,
            })
        }
        Job::Populate {
            map,
            file,
            offset,
            len,
        } => os::populate_read(map, offset, len)
            .map(|()| Outcome {
                bytes,
                ..Outcome::default()
            })
            .map_err(|e| why_populate_failed(file, offset as u64, len, e)),
    }
}
