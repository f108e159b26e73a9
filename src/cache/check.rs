//! What a file written to a cache is checked by before it is published (its digest, or every byte in), and the hash of it in file order, a step at a time.

use std::fs::File;
use std::io;
use std::ops::Range;

use sha1::Sha1;
use sha2::{Digest, Sha256};

use super::layout::Named;
use crate::os;

/// What the written bytes must be before they are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// They hash to the digest the name gives.
    Digest(Named),
    /// Every byte is in: the store gives no digest, and each read required
    /// the version opened.
    Whole,
}

/// A digest in progress.
pub(crate) enum Hasher {
    Sha256(Sha256),
    GitBlob(Sha1),
    Nothing,
}

/// Bytes read back from the temporary file at a time to hash them.
const HASH_PIECE: usize = 4 << 20;

impl Hasher {
    pub(crate) fn new(check: Check, len: u64) -> Hasher {
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

    /// Whether it needs the bytes at all.
    pub(crate) fn reads(&self) -> bool {
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
    pub(crate) fn mismatch(self, check: Check) -> Option<(String, String)> {
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

/// Hashes the next step of the file from `*at` (at most [`HASH_PIECE`]
/// bytes: from `view`, a map of the file, where it holds them, else read
/// back from the file: just written, in the page cache), and moves `*at` on.
pub(crate) fn hash_step(
    hasher: &mut Hasher,
    (file, view): (&File, Option<&View>),
    at: &mut u64,
    len: u64,
    scratch: &mut Vec<u8>,
) -> io::Result<()> {
    let end = len.min(at.saturating_add(HASH_PIECE as u64));
    if !hasher.reads() {
        *at = len;
        return Ok(());
    }
    if view
        .and_then(|v| v.hash(*at..end, |bytes| hasher.update(bytes)))
        .is_some()
    {
        *at = end;
        return Ok(());
    }
    let n = usize::try_from(end.saturating_sub(*at)).unwrap_or(HASH_PIECE);
    scratch.resize(n, 0);
    os::read_exact_at(file, scratch, *at).map_err(|(_, e)| e)?;
    hasher.update(scratch);
    *at = end;
    Ok(())
}

/// A read-only map of a file being written (its length fixed: its space
/// reserved), which its finished pieces and its check hash from, so that
/// no byte is copied back out of the page cache. Each range hashed is let
/// go of at once: the page cache keeps it, and the map does not add the
/// file's size a second time to the process's resident memory.
pub(crate) struct View(memmap2::Mmap);

impl View {
    /// A map of `file`, where it has `len` bytes.
    pub(crate) fn of(file: &File, len: u64) -> Option<View> {
        let map = crate::storage::map_file(file).ok()?;
        (map.len() as u64 == len).then_some(View(map))
    }

    /// Runs `f` on the bytes of `range` (`None` where the map does not
    /// hold them), then lets go of their pages.
    pub(crate) fn hash<R>(&self, range: Range<u64>, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let from = usize::try_from(range.start).ok()?;
        let to = usize::try_from(range.end).ok()?;
        let out = f(self.0.get(from..to)?);
        // A hint: a failure costs resident memory only. No reference into
        // the range outlives `f`.
        // SAFETY: `DontNeed` on a shared read-only file map only drops this
        // process's page table entries; the bytes stay the file's, faulted in unchanged.
        let _ = unsafe {
            self.0
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, from, to - from)
        };
        Some(out)
    }
}
