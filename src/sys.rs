//! Thin wrappers over the OS calls the loader needs: positional reads that finish, and page-cache advice.

use std::fs::File;
use std::io;

use memmap2::Mmap;

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
    #[cfg(unix)]
    use std::os::unix::fs::FileExt;
    #[cfg(windows)]
    use std::os::windows::fs::FileExt;
    let mut done = 0usize;
    while done < buf.len() {
        let at = offset + done as u64;
        let Some(rest) = buf.get_mut(done..) else {
            break;
        };
        #[cfg(unix)]
        let n = file.read_at(rest, at);
        #[cfg(windows)]
        let n = file.seek_read(rest, at);
        match n {
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

/// Faults `len` bytes of a file map in at `offset` with
/// `MADV_POPULATE_READ` (Linux 5.14+, see madvise(2)), which reports an I/O
/// error or a truncated file as an error instead of raising `SIGBUS`. Where
/// the kernel lacks it, nothing is done: the map stays lazy.
pub(crate) fn populate_read(map: &Mmap, offset: usize, len: usize) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        match map.advise_range(memmap2::Advice::PopulateRead, offset, len) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
            other => other,
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (map, offset, len);
        Ok(())
    }
}

/// Opens `path` for direct I/O (`O_DIRECT`, bypassing the page cache), where
/// the platform has it.
pub(crate) fn open_direct(path: &std::path::Path) -> io::Result<File> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// The alignment direct I/O needs of offsets, lengths and buffers. 4 KiB
/// covers the logical block size of every common device.
pub(crate) const DIRECT_ALIGN: u64 = 4096;

/// Drops a file's clean pages from the page cache
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`, see posix_fadvise(2)). Pages mapped
/// or dirty elsewhere stay. A no-op where unsupported.
pub(crate) fn evict(file: &File) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: posix_fadvise only reads its integer arguments; the fd is
        // valid for the duration of the call because `file` is borrowed.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
    Ok(())
}
