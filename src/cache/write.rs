//! A file written to a cache as a load fetches it: a process-unique temporary file next to its final name, each read written to it as it lands, hashed in file order as the gaps fill, and published once every byte is in and the digest is the store's; abandoned on any failure (the temporary file removed), never failing the load.
//!
//! Publishing (the target's rename, which never replaces) is the only step
//! another process can see; everything before it is private to this one, so
//! two processes writing the same file at once cost each other nothing but
//! the lost race, whatever their locks do (advisory locks silently succeed
//! on some network filesystems).

use std::fs::File;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use sha1::Sha1;
use sha2::{Digest, Sha256};

use super::layout::Named;
use crate::os::{self, Dir};
use crate::source::{CacheStore, CacheUse, CacheWrite, NotCached};

/// Where a written file goes.
pub(crate) trait Target: Send + Sync {
    /// The cache it is in (for the report).
    fn store(&self) -> CacheStore;

    /// Makes the temporary file for `len` bytes, its space reserved where
    /// the filesystem can (and locked where the cache locks), or says why
    /// not.
    fn begin(&self, len: u64) -> Result<TempFile, NotCached>;

    /// Publishes the complete, checked temporary file of `begun` under its
    /// final name (and whatever makes it found there): `Ok(false)` where
    /// another process published that name first.
    fn publish(&self, begun: &TempFile) -> io::Result<bool>;
}

/// A temporary file being written: removed when dropped unless published.
pub(crate) struct TempFile {
    /// The folder of the temporary and final names.
    pub dir: Dir,
    pub temp: String,
    pub file: File,
    /// A lock held for as long as this lives (released as it closes), where
    /// the cache takes one.
    pub _lock: Option<File>,
    /// Set once the temporary name is gone (renamed to the final one).
    pub moved: std::sync::atomic::AtomicBool,
    /// Whether its space is reserved (`fallocate`): a write within it cannot
    /// find the disk full, so that a shared map of it cannot fault on a full
    /// disk (`SIGBUS`).
    pub reserved: bool,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.moved.load(Ordering::Relaxed) {
            let _ = self.dir.remove(&self.temp);
        }
    }
}

/// A name unique in this process (a counter), and unlikely to be met in
/// another (the process id and the time).
pub(crate) fn nonce() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mixed = (u64::from(std::process::id()) << 40) ^ (count << 24) ^ nanos;
    // One round of a 64-bit mixer (splitmix64's finalizer): nearby inputs
    // give unrelated names.
    let mut z = mixed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What the written bytes must be before they are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// They hash to the digest the name gives.
    Digest(Named),
    /// Every byte is in: the store gives no digest, and each read required
    /// the version opened.
    Whole,
}

/// A hash in progress.
enum Hasher {
    Sha256(Sha256),
    GitBlob(Sha1),
    Nothing,
}

impl Hasher {
    fn new(check: Check, len: u64) -> Hasher {
        match check {
            Check::Digest(Named::Sha256(_)) => Hasher::Sha256(Sha256::new()),
            Check::Digest(Named::GitBlob(_)) => {
                let mut sha = Sha1::new();
                sha.update(format!("blob {len}\0").as_bytes());
                Hasher::GitBlob(sha)
            }
            Check::Whole => Hasher::Nothing,
        }
    }

    fn reads(&self) -> bool {
        !matches!(self, Hasher::Nothing)
    }

    fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::Sha256(sha) => sha.update(bytes),
            Hasher::GitBlob(sha) => sha.update(bytes),
            Hasher::Nothing => {}
        }
    }

    /// `None` where the bytes match, else (expected, actual) in hex.
    fn mismatch(self, check: Check) -> Option<(String, String)> {
        let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let (expected, actual): (Vec<u8>, Vec<u8>) = match (self, check) {
            (Hasher::Sha256(sha), Check::Digest(Named::Sha256(want))) => {
                (want.to_vec(), sha.finalize().to_vec())
            }
            (Hasher::GitBlob(sha), Check::Digest(Named::GitBlob(want))) => {
                (want.to_vec(), sha.finalize().to_vec())
            }
            _ => return None,
        };
        (expected != actual).then(|| (hex(&expected), hex(&actual)))
    }
}

/// Where a write is.
enum Phase {
    /// Nothing written yet: the reads so far are within the file's header
    /// (a header-only open reads no more), kept here for when the load
    /// reads on.
    Waiting { kept: Vec<(u64, Vec<u8>)> },
    /// The temporary file exists and reads are written to it.
    Writing(Box<Progress>),
    /// Published, or given up.
    Done(Result<(), NotCached>),
}

struct Progress {
    begun: Arc<TempFile>,
    /// Where the file is mapped shared as the load's destination, in this
    /// process's addresses: a read that lands there is in the file already
    /// (it is recorded and hashed, not written); any other is written.
    mapped: Option<Range<usize>>,
    /// The file was handed out to be mapped, its map not yet registered.
    handed: bool,
    /// The byte ranges written, sorted, merged.
    covered: Vec<Range<u64>>,
    /// Bytes from 0 hashed so far.
    hashed: u64,
    /// `None` while a thread hashes (the others only record what landed).
    hasher: Option<Hasher>,
}

struct State {
    phase: Phase,
    /// Landed reads are not written (the node copy brings the bytes).
    paused: bool,
}

/// A file written to a cache as it is fetched.
pub(crate) struct Write {
    target: Box<dyn Target>,
    len: u64,
    check: Check,
    /// Reads entirely before this offset (the header) do not start the
    /// write: they are kept until one reads past it.
    start_at: u64,
    state: Mutex<State>,
    /// The flags of the load that fetches it: set, nothing is published.
    cancel: crate::cancel::Cancel,
}

/// Bytes read back from the temporary file at a time to hash them.
const HASH_PIECE: usize = 4 << 20;
/// Bytes of an image written at a time.
const IMAGE_PIECE: usize = 64 << 20;

impl Write {
    /// A write of a file of `len` bytes to `target`, checked by `check`,
    /// started by the first read at or past `start_at`.
    pub(crate) fn new(target: Box<dyn Target>, len: u64, check: Check, start_at: u64) -> Write {
        Write {
            target,
            len,
            check,
            start_at: start_at.min(len),
            state: Mutex::new(State {
                phase: Phase::Waiting { kept: Vec::new() },
                paused: false,
            }),
            cancel: crate::cancel::current(),
        }
    }

    /// A write that is over before it began, for this reason.
    pub(crate) fn refused(target: Box<dyn Target>, len: u64, why: NotCached) -> Write {
        let write = Write::new(target, len, Check::Whole, 0);
        write.lock().phase = Phase::Done(Err(why));
        write
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What became of it, for the report.
    pub(crate) fn outcome(&self) -> CacheUse {
        let store = self.target.store();
        let state = self.lock();
        let why = match &state.phase {
            Phase::Done(Ok(())) => return CacheUse::Written { store },
            Phase::Done(Err(why)) => why.clone(),
            Phase::Writing(p) => NotCached::Partial {
                read: p.covered.iter().map(|r| r.end - r.start).sum(),
                len: self.len,
            },
            Phase::Waiting { kept } => NotCached::Partial {
                read: kept.iter().map(|(_, b)| b.len() as u64).sum(),
                len: self.len,
            },
        };
        CacheUse::NotCached { store, why }
    }

    /// The bytes at `offset` of the file have been read: written to the
    /// temporary file (made now if this is the first read past the
    /// header), hashed where they extend what is hashed from the start, and
    /// the file published once complete.
    pub(crate) fn land(&self, offset: u64, bytes: &[u8]) {
        self.land_with(offset, bytes, false);
    }

    fn land_with(&self, offset: u64, bytes: &[u8], image: bool) {
        let end = offset.saturating_add(bytes.len() as u64);
        if bytes.is_empty() || end > self.len {
            return;
        }
        let mut state = self.lock();
        if state.paused && !image {
            return;
        }
        let (begun, mapped) = match &mut state.phase {
            Phase::Done(_) => return,
            Phase::Waiting { kept } if end <= self.start_at => {
                kept.push((offset, bytes.to_vec()));
                return;
            }
            Phase::Waiting { .. } => match self.begin(&mut state) {
                Some(begun) => (begun, false),
                None => return,
            },
            Phase::Writing(progress) => {
                // In the map at its own offset: the bytes are in the file.
                let at = bytes.as_ptr() as usize;
                let in_file = progress.mapped.as_ref().is_some_and(|map| {
                    map.contains(&at)
                        && at + bytes.len() <= map.end
                        && (at - map.start) as u64 == offset
                });
                (Arc::clone(&progress.begun), in_file)
            }
        };
        drop(state);
        if !mapped {
            if let Err(e) = os::write_all_at(&begun.file, bytes, offset) {
                self.abandon_with(NotCached::of_io(&e));
                return;
            }
        }
        let mut state = self.lock();
        if let Phase::Writing(progress) = &mut state.phase {
            cover(&mut progress.covered, offset..end);
            self.advance(state, Some((offset, bytes)));
        }
    }

    /// Makes the temporary file and writes what was kept; `None` where that
    /// failed (the write is then over, saying why).
    fn begin(&self, state: &mut MutexGuard<'_, State>) -> Option<Arc<TempFile>> {
        let kept = match std::mem::replace(&mut state.phase, Phase::Done(Ok(()))) {
            Phase::Waiting { kept } => kept,
            other => {
                state.phase = other;
                return None;
            }
        };
        let begun = match self.target.begin(self.len) {
            Ok(begun) => Arc::new(begun),
            Err(why) => {
                state.phase = Phase::Done(Err(why));
                return None;
            }
        };
        let mut covered = Vec::new();
        for (offset, bytes) in &kept {
            if let Err(e) = os::write_all_at(&begun.file, bytes, *offset) {
                state.phase = Phase::Done(Err(NotCached::of_io(&e)));
                return None;
            }
            cover(&mut covered, *offset..*offset + bytes.len() as u64);
        }
        state.phase = Phase::Writing(Box::new(Progress {
            begun: Arc::clone(&begun),
            mapped: None,
            handed: false,
            covered,
            hashed: 0,
            hasher: Some(Hasher::new(self.check, self.len)),
        }));
        Some(begun)
    }

    /// Hashes what is written from where the hash stands on, unless another
    /// thread does; publishes the file once every byte is in and hashed.
    /// `landed`: bytes this thread just wrote, hashed from memory.
    fn advance<'s>(&'s self, mut state: MutexGuard<'s, State>, landed: Option<(u64, &[u8])>) {
        loop {
            let Phase::Writing(progress) = &mut state.phase else {
                return;
            };
            let reach = match progress.covered.first() {
                Some(first) if first.start == 0 => first.end,
                _ => 0,
            };
            if reach <= progress.hashed {
                if progress.hashed == self.len && progress.hasher.is_some() {
                    self.finish(&mut state);
                }
                return;
            }
            let Some(mut hasher) = progress.hasher.take() else {
                // Another thread hashes, and will see these bytes.
                return;
            };
            let (from, begun) = (progress.hashed, Arc::clone(&progress.begun));
            drop(state);
            let hashed = if hasher.reads() {
                hash_range(&mut hasher, &begun.file, from..reach, landed)
            } else {
                Ok(())
            };
            state = self.lock();
            let Phase::Writing(progress) = &mut state.phase else {
                return;
            };
            if let Err(e) = hashed {
                state.phase = Phase::Done(Err(NotCached::of_io(&e)));
                return;
            }
            progress.hasher = Some(hasher);
            progress.hashed = reach;
        }
    }

    /// Checks the complete file and publishes it.
    fn finish(&self, state: &mut MutexGuard<'_, State>) {
        let Phase::Writing(progress) = std::mem::replace(&mut state.phase, Phase::Done(Ok(())))
        else {
            return;
        };
        let Progress { begun, hasher, .. } = *progress;
        let outcome = match hasher.and_then(|h| h.mismatch(self.check)) {
            Some((expected, actual)) => Err(NotCached::Mismatch { expected, actual }),
            None if self.cancel.is_set() => Err(NotCached::Cancelled),
            None => match self.target.publish(&begun) {
                Ok(true) => Ok(()),
                Ok(false) => Err(NotCached::PublishedElsewhere),
                Err(e) => Err(NotCached::of_io(&e)),
            },
        };
        state.phase = Phase::Done(outcome);
    }

    fn abandon_with(&self, why: NotCached) {
        let mut state = self.lock();
        if !matches!(state.phase, Phase::Done(_)) {
            state.phase = Phase::Done(Err(why));
        }
    }
}

/// Hashes `range` of the file: the part `landed` holds from memory, the rest
/// read back from the temporary file (just written: in the page cache).
fn hash_range(
    hasher: &mut Hasher,
    file: &File,
    range: Range<u64>,
    landed: Option<(u64, &[u8])>,
) -> io::Result<()> {
    let mut at = range.start;
    let mut scratch = Vec::new();
    while at < range.end {
        if let Some((offset, bytes)) = landed {
            let end = offset + bytes.len() as u64;
            if (offset..end).contains(&at) {
                let stop = end.min(range.end);
                let from = (at - offset) as usize;
                let to = (stop - offset) as usize;
                if let Some(piece) = bytes.get(from..to) {
                    hasher.update(piece);
                    at = stop;
                    continue;
                }
            }
        }
        // Up to the next landed byte, or a piece.
        let mut stop = range.end.min(at + HASH_PIECE as u64);
        if let Some((offset, _)) = landed {
            if offset > at {
                stop = stop.min(offset);
            }
        }
        let n = (stop - at) as usize;
        scratch.resize(n, 0);
        os::read_exact_at(file, &mut scratch, at).map_err(|(_, e)| e)?;
        hasher.update(&scratch);
        at = stop;
    }
    Ok(())
}

/// Adds `range` to the sorted, merged ranges `covered`.
fn cover(covered: &mut Vec<Range<u64>>, range: Range<u64>) {
    let at = covered.partition_point(|r| r.end < range.start);
    let mut merged = range;
    while let Some(next) = covered.get(at) {
        if next.start > merged.end {
            break;
        }
        merged = merged.start.min(next.start)..merged.end.max(next.end);
        covered.remove(at);
    }
    covered.insert(at, merged);
}

impl CacheWrite for Write {
    fn map_destination(&self) -> Option<File> {
        let mut state = self.lock();
        if state.paused || !matches!(state.phase, Phase::Waiting { .. }) {
            return None;
        }
        let begun = self.begin(&mut state)?;
        match &mut state.phase {
            // Without reserved space a full disk would fault the map
            // (`SIGBUS`): such a file is written as it is read instead.
            Phase::Writing(progress) if begun.reserved => {
                progress.handed = true;
                begun.file.try_clone().ok()
            }
            _ => None,
        }
    }

    fn mapped_at(&self, addresses: Range<usize>) {
        let mut state = self.lock();
        if let Phase::Writing(progress) = &mut state.phase {
            if progress.handed && addresses.len() as u64 == self.len {
                progress.mapped = Some(addresses);
            }
        }
    }

    fn pause(&self) {
        self.lock().paused = true;
    }

    fn resume(&self) {
        self.lock().paused = false;
    }

    fn write_image(&self, image: &[u8]) {
        if image.len() as u64 != self.len {
            self.abandon_with(NotCached::Partial {
                read: image.len() as u64,
                len: self.len,
            });
            return;
        }
        let mut at = 0usize;
        for piece in image.chunks(IMAGE_PIECE) {
            self.land_with(at as u64, piece, true);
            at += piece.len();
            if matches!(self.lock().phase, Phase::Done(_)) {
                return;
            }
        }
        if image.is_empty() {
            // Nothing to land: the empty file is complete as it begins.
            let mut state = self.lock();
            if self.begin(&mut state).is_some() {
                self.advance(state, None);
            }
        }
    }

    fn abandon(&self, why: NotCached) {
        self.abandon_with(why);
    }
}

#[cfg(test)]
#[path = "write_tests.rs"]
mod tests;
