//! The objects the server hands out: a file of the served directory or a replacement, its
//! bytes, length, ETag and SHA-256, computed once per version.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime};

use sha2::{Digest, Sha256};

/// One version of an object.
#[derive(Debug, Clone)]
pub(crate) struct Object {
    pub len: u64,
    /// The strong ETag, quoted: the SHA-256 of the contents, as the hub gives for LFS files.
    pub etag: String,
    /// The SHA-256 hex of the contents (`X-Linked-Etag`, unquoted here).
    pub sha256: String,
    pub body: Body,
}

/// Where an object's bytes are.
#[derive(Debug, Clone)]
pub(crate) enum Body {
    File(Arc<File>),
    Memory(Arc<[u8]>),
}

impl Body {
    /// Reads `buf.len()` bytes at `offset` (the caller keeps within the object).
    pub(crate) fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match self {
            Body::File(file) => file.read_exact_at(buf, offset),
            Body::Memory(bytes) => {
                let start = usize::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
                let src = bytes
                    .get(start..start + buf.len())
                    .ok_or(io::ErrorKind::UnexpectedEof)?;
                buf.copy_from_slice(src);
                Ok(())
            }
        }
    }
}

/// A replacement of one object, in force from `at` on.
#[derive(Debug)]
struct Replaced {
    at: Instant,
    object: Object,
}

/// The served directory, with the digests of the file versions seen and the replacements.
#[derive(Debug)]
pub(crate) struct Objects {
    root: PathBuf,
    /// Digests by path, valid for one (length, modification time) of the file.
    digests: Mutex<HashMap<String, (u64, SystemTime, String)>>,
    replaced: Mutex<HashMap<String, Vec<Replaced>>>,
}

impl Objects {
    pub(crate) fn new(root: PathBuf) -> Self {
        Self {
            root,
            digests: Mutex::new(HashMap::new()),
            replaced: Mutex::new(HashMap::new()),
        }
    }

    /// Makes `contents` the object at `path` from `at` on (later replacements win).
    pub(crate) fn replace(&self, path: &str, contents: Vec<u8>, at: Instant) {
        let sha256 = hex_sha256(&contents);
        let object = Object {
            len: contents.len() as u64,
            etag: format!("\"{sha256}\""),
            sha256,
            body: Body::Memory(contents.into()),
        };
        let mut replaced = self.replaced.lock().unwrap_or_else(PoisonError::into_inner);
        let list = replaced.entry(path.to_owned()).or_default();
        list.push(Replaced { at, object });
        list.sort_by_key(|r| r.at);
    }

    /// The object at `path` (a confined relative path) now; `None` when there is none.
    pub(crate) fn get(&self, path: &str, now: Instant) -> Option<Object> {
        {
            let replaced = self.replaced.lock().unwrap_or_else(PoisonError::into_inner);
            let current = replaced
                .get(path)
                .and_then(|list| list.iter().rev().find(|r| r.at <= now));
            if let Some(r) = current {
                return Some(r.object.clone());
            }
        }
        let file = File::open(self.root.join(path)).ok()?;
        let meta = file.metadata().ok()?;
        if !meta.is_file() {
            return None;
        }
        let len = meta.len();
        let mtime = meta.modified().ok()?;
        let known = {
            let digests = self.digests.lock().unwrap_or_else(PoisonError::into_inner);
            digests
                .get(path)
                .filter(|(l, m, _)| (*l, *m) == (len, mtime))
                .map(|(_, _, sha)| sha.clone())
        };
        let sha256 = match known {
            Some(sha) => sha,
            None => {
                // Hashed outside the lock: two first requests may both hash, never wait on
                // each other's file.
                let sha = hex_sha256_file(&file, len).ok()?;
                self.digests
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(path.to_owned(), (len, mtime, sha.clone()));
                sha
            }
        };
        Some(Object {
            len,
            etag: format!("\"{sha256}\""),
            sha256,
            body: Body::File(Arc::new(file)),
        })
    }
}

/// The SHA-256 of `bytes`, in lowercase hex.
pub fn hex_sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex_sha256_file(file: &File, len: u64) -> io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0; 1 << 20];
    let mut offset = 0;
    while offset < len {
        let n = (len - offset).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], offset)?;
        hasher.update(&buf[..n]);
        offset += n as u64;
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn files_get_their_digest_and_replacements_win_from_their_time() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), b"abc").unwrap();
        let objects = Objects::new(dir.path().to_owned());
        let t0 = Instant::now();
        let a = objects.get("a", t0).unwrap();
        // The SHA-256 of "abc" (FIPS 180-2, appendix B.1).
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!((a.len, a.sha256.as_str()), (3, abc));
        assert_eq!(a.etag, format!("\"{abc}\""));
        assert!(objects.get("missing", t0).is_none());

        objects.replace("a", b"abcd".to_vec(), t0 + Duration::from_secs(60));
        assert_eq!(objects.get("a", t0).unwrap().etag, a.etag);
        let later = objects.get("a", t0 + Duration::from_secs(61)).unwrap();
        assert_eq!(later.len, 4);
        assert_ne!(later.etag, a.etag);
        let mut buf = [0; 2];
        later.body.read_exact_at(&mut buf, 2).unwrap();
        assert_eq!(&buf, b"cd");
        assert!(later.body.read_exact_at(&mut buf, 3).is_err());
    }
}
