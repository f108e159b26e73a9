//! The objects the server hands out: a file of the served directory or a replacement, its
//! bytes, length, ETag, SHA-256 and git blob id, computed once per version.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime};

use sha1::Sha1;
use sha2::{Digest, Sha256};

/// One version of an object.
#[derive(Debug, Clone)]
pub(crate) struct Object {
    pub len: u64,
    /// The strong ETag, quoted: the SHA-256 of the contents, as the hub gives for LFS files.
    pub etag: String,
    /// The SHA-256 hex of the contents (`X-Linked-Etag`, unquoted here).
    pub sha256: String,
    /// The git blob id of the contents (the SHA-1 of `blob <len>\0` and them): what the hub
    /// names a small, non-LFS file by.
    pub git_oid: String,
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

/// An object's SHA-256 and git blob id, in hex.
type Digests = (String, String);

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
    /// Digests (SHA-256, git blob id) by path, valid for one (length, modification time)
    /// of the file.
    digests: Mutex<HashMap<String, (u64, SystemTime, Digests)>>,
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
        let git_oid = hex(&git_hasher(contents.len() as u64)
            .chain_update(&contents)
            .finalize());
        let object = Object {
            len: contents.len() as u64,
            etag: format!("\"{sha256}\""),
            sha256,
            git_oid,
            body: Body::Memory(contents.into()),
        };
        let mut replaced = self.replaced.lock().unwrap_or_else(PoisonError::into_inner);
        let list = replaced.entry(path.to_owned()).or_default();
        list.push(Replaced { at, object });
        list.sort_by_key(|r| r.at);
    }

    /// The paths of the served files (regular files, not through a symlink), sorted.
    pub(crate) fn paths(&self) -> Vec<String> {
        fn walk(dir: &std::path::Path, prefix: &str, out: &mut Vec<String>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Ok(kind) = entry.file_type() else {
                    continue;
                };
                let path = format!("{prefix}{name}");
                if kind.is_dir() {
                    walk(&entry.path(), &format!("{path}/"), out);
                } else if kind.is_file() {
                    out.push(path);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.root, "", &mut out);
        out.sort();
        out
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
        let (sha256, git_oid) = match known {
            Some(digests) => digests,
            None => {
                // Hashed outside the lock: two first requests may both hash, never wait on
                // each other's file.
                let digests = digests_of_file(&file, len).ok()?;
                self.digests
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(path.to_owned(), (len, mtime, digests.clone()));
                digests
            }
        };
        Some(Object {
            len,
            etag: format!("\"{sha256}\""),
            sha256,
            git_oid,
            body: Body::File(Arc::new(file)),
        })
    }
}

/// The SHA-256 of `bytes`, in lowercase hex.
pub fn hex_sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Git's hasher of a blob of `len` bytes, its header fed.
fn git_hasher(len: u64) -> Sha1 {
    Sha1::new().chain_update(format!("blob {len}\0").as_bytes())
}

/// The SHA-256 and the git blob id of a file, in one pass.
fn digests_of_file(file: &File, len: u64) -> io::Result<Digests> {
    let mut sha256 = Sha256::new();
    let mut git = git_hasher(len);
    let mut buf = vec![0; 1 << 20];
    let mut offset = 0;
    while offset < len {
        let n = (len - offset).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], offset)?;
        sha256.update(&buf[..n]);
        git.update(&buf[..n]);
        offset += n as u64;
    }
    Ok((hex(&sha256.finalize()), hex(&git.finalize())))
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
        // `printf abc | git hash-object --stdin`.
        assert_eq!(a.git_oid, "f2ba8f84ab5c1bce84a7b441cb1959cfc7093b7f");
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
