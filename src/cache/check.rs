//! What a file written to a cache is checked by before it is published (its digest, or every byte in), and the hash of it in file order.

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

/// Hashes `range` of the file: the part `landed` holds from memory, the rest
/// read back from the temporary file (just written: in the page cache).
pub(crate) fn hash_range(
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
