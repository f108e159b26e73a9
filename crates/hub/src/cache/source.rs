//! The two sources a cache puts behind the `Source` seam: a file read from the cache (a local file that says where it came from), and a fetched file whose every read is also written to the cache.

use std::io;
use std::path::Path;
use std::sync::Arc;

use super::check::Check;
use super::write::{Local, Target, Write, in_place};
use crate::mount::Mount;
use crate::os;
use crate::remote::object::RemoteObject;
use crate::source::{CacheStore, CacheUse, CacheWrite, LocalFile, NotCached, Source, Version};

/// A file of the cache: the ordinary local file, reported as read from the cache.
pub(crate) struct Hit {
    pub local: LocalFile,
    pub store: CacheStore,
    /// The SHA-256 its blob's name vouches for: what `verify` checks it against.
    pub sha256: Option<[u8; 32]>,
    /// The hub commit of the snapshot it is read from (the hub cache).
    pub commit: Option<String>,
    /// The object's entity tag the cache keyed it by (a cache directory).
    pub etag: Option<String>,
}

impl Source for Hit {
    fn path(&self) -> &Path {
        self.local.path()
    }

    fn version(&self) -> &Version {
        self.local.version()
    }

    fn read_at(
        &self,
        dst: &mut [u8],
        required: usize,
        offset: u64,
    ) -> Result<(), (u64, io::Error)> {
        self.local.read_at(dst, required, offset)
    }

    fn mount(&self) -> Option<&Mount> {
        self.local.mount()
    }

    fn local(&self) -> Option<&LocalFile> {
        Some(&self.local)
    }

    fn published_sha256(&self) -> Option<[u8; 32]> {
        self.sha256
    }

    fn cache_use(&self) -> Option<CacheUse> {
        Some(CacheUse::Hit { store: self.store })
    }

    fn commit(&self) -> Option<&str> {
        self.commit.as_deref()
    }

    fn etag(&self) -> Option<&str> {
        self.etag.as_deref()
    }
}

/// A remote object whose reads are also written to the cache.
pub(crate) struct Fetched {
    object: Arc<RemoteObject>,
    write: Arc<Write>,
}

impl Fetched {
    /// The object, written to `target` as it is read, checked by `check` (else not
    /// written, for that reason).
    pub(crate) fn new(
        object: Arc<RemoteObject>,
        target: Box<dyn Target>,
        check: Result<Check, NotCached>,
    ) -> Fetched {
        // Where the header ends, by the length prefix the open kept: reads before it start
        // no write.
        let mut prefix = [0u8; 8];
        let start_at = match check.is_ok().then(|| object.read_at(&mut prefix, 8, 0)) {
            Some(Ok(())) if object.kept_prefix() >= 8 => {
                8u64.saturating_add(u64::from_le_bytes(prefix))
            }
            _ => 0,
        };
        let write = Write::of(
            target,
            object.len(),
            check,
            start_at,
            object.cancel().clone(),
        );
        Fetched { object, write }
    }

    /// Fetches `dst` from `offset` (at least `required` bytes), written to the cache.
    fn fetch(&self, dst: &mut [u8], required: usize, offset: u64) -> Result<(), (u64, io::Error)> {
        // Written as the body arrives: a load killed half way leaves what it fetched.
        let land = |at: u64, bytes: &[u8]| self.write.land(at, bytes);
        self.object
            .read(dst, required, offset, Some(&land))
            .map_err(|e| {
                let at = e.range.as_ref().map_or(offset, |r| r.start);
                (at, e.into_io())
            })
    }

    /// Fills all of `range` of `dst` (the file from `base`): from the cache's file where
    /// `local` is given (nothing where in place), else fetched.
    fn fill(
        &self,
        dst: &mut [u8],
        base: u64,
        range: std::ops::Range<u64>,
        local: Option<&Local>,
    ) -> Result<(), (u64, io::Error)> {
        let part = part_of(dst, base, &range)?;
        match local {
            Some(local) if in_place(local.mapped.as_ref(), part, range.start) => Ok(()),
            Some(local) => os::read_exact_at(&local.file, part, range.start),
            None => {
                let len = part.len();
                self.fetch(part, len, range.start)
            }
        }
    }

    /// Reads `dst` from `offset`: what the cache's file holds, the rest fetched.
    fn read_through(
        &self,
        dst: &mut [u8],
        required: usize,
        offset: u64,
    ) -> Result<(), (u64, io::Error)> {
        let want = offset.saturating_add(dst.len() as u64);
        let end = self.object.len().min(want);
        let local = (offset < end).then(|| self.write.local(offset..end));
        let Some(Some(local)) = local else {
            return self.fetch(dst, required, offset);
        };
        let mut at = offset;
        for range in &local.ranges {
            if range.start > at {
                self.fill(dst, offset, at..range.start, None)?;
            }
            self.fill(dst, offset, range.clone(), Some(&local))?;
            at = range.end;
        }
        if at < end {
            self.fill(dst, offset, at..end, None)?;
        }
        // Bytes read from the file are never landed: hashed here.
        self.write.advance_now();
        Ok(())
    }
}

/// The part of `dst` (the file from `base`) that holds `range`.
fn part_of<'d>(
    dst: &'d mut [u8],
    base: u64,
    range: &std::ops::Range<u64>,
) -> Result<&'d mut [u8], (u64, io::Error)> {
    let from = usize::try_from(range.start - base).unwrap_or(usize::MAX);
    let to = usize::try_from(range.end - base).unwrap_or(usize::MAX);
    dst.get_mut(from..to).ok_or_else(|| {
        let e = io::Error::new(io::ErrorKind::InvalidInput, "a range past the buffer");
        (range.start, e)
    })
}

impl Source for Fetched {
    fn path(&self) -> &Path {
        self.object.path()
    }

    fn version(&self) -> &Version {
        self.object.version()
    }

    fn read_at(
        &self,
        dst: &mut [u8],
        required: usize,
        offset: u64,
    ) -> Result<(), (u64, io::Error)> {
        self.read_through(dst, required, offset)?;
        // The read that completed a file holding bytes an earlier load left proves them
        // before the load hands them out.
        let refetch = |at: u64, bytes: &mut [u8]| {
            let n = bytes.len();
            self.object
                .read(bytes, n, at, None)
                .map_err(|e| e.into_io())
        };
        self.write.prove(&refetch).map_err(|e| (offset, e))
    }

    fn mount(&self) -> Option<&Mount> {
        None
    }

    fn published_sha256(&self) -> Option<[u8; 32]> {
        self.object.published_sha256()
    }

    fn fetched_whole(&self) -> bool {
        self.object.fetched_whole()
    }

    fn own_error(
        &self,
        operation: crate::error::Operation,
        error: &io::Error,
    ) -> Option<crate::error::Error> {
        self.object.own_error(operation, error)
    }

    fn cache_use(&self) -> Option<CacheUse> {
        Some(self.write.outcome())
    }

    fn cache_write(&self) -> Option<&dyn CacheWrite> {
        Some(&*self.write)
    }

    fn commit(&self) -> Option<&str> {
        self.object.commit()
    }
}
