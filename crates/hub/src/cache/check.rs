//! What a file written to a cache is checked by before it is published (its digest, or every byte in), and the hash of it in file order (`verify::InOrder`), a step at a time.

use std::fs::File;
use std::io;
use std::ops::Range;

use sha1::Sha1;
use sha2::digest::Update;
use sha2::{Digest, Sha256};

use super::layout::Named;
use crate::os;
use crate::verify::InOrder;

/// What the written bytes must be before they are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// They hash to the digest the name gives.
    Digest(Named),
    /// Every byte is in: the store gives no digest, each read required the version.
    Whole,
}

pub(crate) enum Hasher {
    Sha256(Sha256),
    GitBlob(Sha1),
    Nothing,
}

/// Bytes read back from the temporary file at a time to hash them.
const HASH_PIECE: usize = 4 << 20;

impl Update for Hasher {
    fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::Sha256(sha) => Update::update(sha, bytes),
            Hasher::GitBlob(sha) => Update::update(sha, bytes),
            Hasher::Nothing => {}
        }
    }
}

impl Hasher {
    /// The hash `check` takes of a file of `len` bytes (at its end where it needs none).
    pub(crate) fn start(check: Check, len: u64) -> InOrder<'static, Hasher> {
        match check {
            Check::Digest(Named::Sha256(_)) => InOrder::new(Hasher::Sha256(Sha256::new()), 0),
            Check::Digest(Named::GitBlob(_)) => {
                let mut sha = Sha1::new();
                Update::update(&mut sha, format!("blob {len}\0").as_bytes());
                InOrder::new(Hasher::GitBlob(sha), 0)
            }
            Check::Whole => InOrder::new(Hasher::Nothing, len),
        }
    }

    /// `None` where the bytes match, else (expected, actual) in hex.
    pub(crate) fn mismatch(self, check: Check) -> Option<(String, String)> {
        let hex = crate::verify::hex;
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

/// Hashes the next step of the file (at most [`HASH_PIECE`] bytes).
pub(crate) fn hash_step(
    hash: &mut InOrder<'static, Hasher>,
    (file, view): (&File, Option<&View>),
    len: u64,
    scratch: &mut Vec<u8>,
) -> io::Result<()> {
    let at = hash.next();
    let end = len.min(at.saturating_add(HASH_PIECE as u64));
    with_bytes((file, view), at..end, scratch, |bytes| hash.take(at, bytes)).map(drop)
}

/// Runs `f` on the bytes of `range` of a file just written: from `view` where it holds
/// them, else read back into `scratch`.
pub(crate) fn with_bytes<R>(
    (file, view): (&File, Option<&View>),
    range: Range<u64>,
    scratch: &mut Vec<u8>,
    mut f: impl FnMut(&[u8]) -> R,
) -> io::Result<R> {
    if let Some(out) = view.and_then(|v| v.hash(range.clone(), &mut f)) {
        return Ok(out);
    }
    let n = usize::try_from(range.end.saturating_sub(range.start))
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    scratch.resize(n, 0);
    os::read_exact_at(file, scratch, range.start).map_err(|(_, e)| e)?;
    Ok(f(scratch))
}

/// A read-only map of a file being written (its space reserved), to hash from without
/// copying out of the page cache; each range hashed is let go of at once, so the map does
/// not add the file's size to the resident memory.
pub(crate) struct View(memmap2::Mmap);

impl View {
    /// A map of `file`, where it has `len` bytes.
    pub(crate) fn of(file: &File, len: u64) -> Option<View> {
        let map = crate::storage::map_file(file).ok()?;
        (map.len() as u64 == len).then_some(View(map))
    }

    /// Runs `f` on the bytes of `range`, where held, then lets go of their pages.
    pub(crate) fn hash<R>(&self, range: Range<u64>, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let from = usize::try_from(range.start).ok()?;
        let to = usize::try_from(range.end).ok()?;
        let out = f(self.0.get(from..to)?);
        // A hint: a failure costs resident memory only.
        // SAFETY: `DontNeed` on a shared read-only file map only drops this
        // process's page table entries; the bytes stay the file's, faulted in unchanged.
        let _ = unsafe {
            self.0
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, from, to - from)
        };
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file's digest by `check`, hashed a step at a time (through a map
    /// of it where `mapped`).
    fn stepped(bytes: &[u8], check: Check, mapped: bool) -> Option<(String, String)> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, bytes).unwrap();
        let file = File::open(&path).unwrap();
        let len = bytes.len() as u64;
        let view = mapped.then(|| View::of(&file, len).unwrap());
        let mut hash = Hasher::start(check, len);
        let mut scratch = Vec::new();
        let mut steps = 0;
        while hash.next() < len {
            hash_step(&mut hash, (&file, view.as_ref()), len, &mut scratch).unwrap();
            steps += 1;
        }
        assert_eq!(steps, bytes.len().div_ceil(HASH_PIECE), "{check:?}");
        hash.into_inner().mismatch(check)
    }

    #[test]
    fn a_file_hashed_in_steps_checks_as_hashed_whole() {
        let bytes: Vec<u8> = (0..(2 * HASH_PIECE + 17))
            .map(|i| (i % 251) as u8)
            .collect();
        let sha256: [u8; 32] = Sha256::digest(&bytes).into();
        let mut git = Sha1::new();
        Update::update(&mut git, format!("blob {}\0", bytes.len()).as_bytes());
        Update::update(&mut git, &bytes);
        let git: [u8; 20] = git.finalize().into();
        for mapped in [false, true] {
            let good = Check::Digest(Named::Sha256(sha256));
            assert_eq!(stepped(&bytes, good, mapped), None);
            assert_eq!(
                stepped(&bytes, Check::Digest(Named::GitBlob(git)), mapped),
                None
            );
            let mut wrong = sha256;
            wrong[0] ^= 1;
            let (expected, actual) = stepped(&bytes, Check::Digest(Named::Sha256(wrong)), mapped)
                .expect("a wrong digest is a mismatch");
            assert_eq!(actual, crate::verify::hex(&sha256));
            assert_eq!(expected, crate::verify::hex(&wrong));
        }
        // Every byte in is all a store without digests asks: nothing read.
        assert_eq!(Hasher::start(Check::Whole, 9).next(), 9);
    }

    #[test]
    fn a_git_blob_hashes_as_git_names_it() {
        // `printf 'hello\n' | git hash-object --stdin`
        let named = "ce013625030ba8dba906f756967f9e9ca394464a";
        let git: Vec<u8> = (0..20)
            .map(|i| u8::from_str_radix(&named[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        let check = Check::Digest(Named::GitBlob(git.try_into().unwrap()));
        assert_eq!(stepped(b"hello\n", check, false), None);
    }
}
