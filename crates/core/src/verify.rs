//! Integrity: the one in-order hasher (any digest over a file's bytes in file order, [`InOrder`], also the caches'), the SHA-256 of each file a load reads, streamed as its reads land, and the digest it must have (a Hugging Face cache blob's name, or the caller's).
//!
//! A buffered file read whole is hashed by the reader threads as its chunks
//! land, out of order: each is kept (borrowed) until the bytes before it are
//! hashed. Other files are hashed in a pass of their own over the whole file.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use sha2::digest::Update;
use sha2::{Digest, Sha256};

/// A SHA-256 digest.
pub(crate) type Digest256 = [u8; 32];

/// A digest in lowercase hex, as `sha256sum` and the Hugging Face cache
/// write it.
pub fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A SHA-256 digest from 64 hex digits (either case, spaces around them
/// left out); `None` for anything else.
pub fn parse_hex(text: &str) -> Option<Digest256> {
    let mut out = [0u8; 32];
    hex_into(text.trim(), &mut out).then_some(out)
}

/// Whether `text` is hex digits (either case) that fill `out` exactly,
/// which then holds their bytes.
pub fn hex_into(text: &str, out: &mut [u8]) -> bool {
    let byte = |pair: &[u8]| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok();
    text.len() == 2 * out.len()
        && text.is_ascii()
        && (out.iter_mut().zip(text.as_bytes().chunks_exact(2)))
            .all(|(b, pair)| byte(pair).map(|v| *b = v).is_some())
}

/// The digest a file must have where its canonical path says so: a Hugging
/// Face cache blob (`.../blobs/<sha256>`, named by its content's SHA-256).
pub(crate) fn expected_from_cache(canonical: &Path) -> Option<Digest256> {
    let parent = canonical.parent()?.file_name()?;
    if parent != "blobs" {
        return None;
    }
    parse_hex(canonical.file_name()?.to_str()?)
}

/// The one in-order hasher: any digest fed in pieces (`digest::Update`: a
/// load's SHA-256, a cache's SHA-256 or git-blob SHA-1, a piece's XXH3) over
/// a file's bytes from an offset on, in file order. Bytes ahead of the next
/// are refused ([`take`](Self::take)), or kept until the gap closes where
/// the caller keeps them alive ([`land`](Self::land)).
#[derive(Debug, Clone)]
pub struct InOrder<'a, H> {
    hash: H,
    next: u64,
    /// Runs that landed ahead of `next`, by file offset.
    ahead: BTreeMap<u64, &'a [u8]>,
}

impl<'a, H: Update> InOrder<'a, H> {
    /// `hash` over the file's bytes from `from` on (none taken yet).
    pub fn new(hash: H, from: u64) -> InOrder<'a, H> {
        let (next, ahead) = (from, BTreeMap::new());
        InOrder { hash, next, ahead }
    }

    /// The offset of the byte it takes next.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// Takes `bytes`, the file's at `offset`, where they continue the hash:
    /// whether they did (else nothing is taken).
    pub fn take(&mut self, offset: u64, bytes: &[u8]) -> bool {
        if offset != self.next {
            return false;
        }
        self.hash.update(bytes);
        self.next += bytes.len() as u64;
        true
    }

    /// Takes `bytes`, the file's at `offset`, and what waited for them, if
    /// they are next; else keeps them for later.
    pub fn land(&mut self, offset: u64, bytes: &'a [u8]) {
        self.ahead.insert(offset, bytes);
        while let Some(bytes) = self.ahead.remove(&self.next) {
            self.take(self.next, bytes);
        }
    }

    /// The digest of the file up to `end`, where every byte before it was
    /// taken and none beyond; `None` where some never landed.
    pub fn finish(self, end: u64) -> Option<H> {
        (self.next == end && self.ahead.is_empty()).then_some(self.hash)
    }

    /// The digest of what was taken.
    pub fn into_inner(self) -> H {
        self.hash
    }
}

/// A file's SHA-256, fed with its bytes in any order from many threads:
/// each run is hashed once every byte before it is.
pub(crate) struct StreamHasher<'a>(Mutex<InOrder<'a, Sha256>>);

impl<'a> StreamHasher<'a> {
    /// A hasher that has hashed `prefix`, the file's first bytes.
    pub fn new(prefix: &[u8]) -> StreamHasher<'a> {
        let mut sha = InOrder::new(Sha256::new(), 0);
        sha.take(0, prefix);
        StreamHasher(Mutex::new(sha))
    }

    /// The bytes at `offset` of the file have landed ([`InOrder::land`]).
    pub(crate) fn land(&self, offset: u64, bytes: &'a [u8]) {
        if let Ok(mut sha) = self.0.lock() {
            sha.land(offset, bytes);
        }
    }

    /// The digest of the file's first `len` bytes, or `None` where some of
    /// them never landed (a read failed, and the load with it).
    pub(crate) fn finish(self, len: u64) -> Option<Digest256> {
        Some(self.0.into_inner().ok()?.finish(len)?.finalize().into())
    }
}

/// The SHA-256 of a whole mapped file.
pub(crate) fn of_bytes(bytes: &[u8]) -> Digest256 {
    Sha256::digest(bytes).into()
}

/// The SHA-256 of the first `len` bytes of a source, by positional
/// reads of 8 MiB; the offset and error of a failed read.
pub(crate) fn of_source(
    source: &dyn crate::source::Source,
    len: u64,
) -> Result<Digest256, (u64, std::io::Error)> {
    let mut sha = InOrder::new(Sha256::new(), 0);
    crate::os::read_in_steps(0..len, &mut Vec::new(), 8 << 20, |piece, at| {
        source.read_at(piece, piece.len(), at)?;
        sha.take(at, piece);
        Ok(())
    })?;
    Ok(sha.into_inner().finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sha256sum` of the empty input and of "abc" (FIPS 180-2, appendix B).
    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    const ABC: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn hex_round_trips() {
        let d = parse_hex(ABC).unwrap();
        assert_eq!(hex(&d), ABC);
        assert_eq!(parse_hex(&ABC.to_uppercase()), Some(d));
        for bad in [
            "",
            "abc",
            &ABC[1..],
            &format!("{ABC}0"),
            &ABC.replace('a', "g"),
        ] {
            assert_eq!(parse_hex(bad), None, "{bad}");
        }
    }

    #[test]
    fn streamed_in_any_order_equals_the_whole() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let whole: Digest256 = Sha256::digest(&data).into();
        // A prefix, then runs landing in a scrambled order.
        let (prefix, rest) = data.split_at(1000);
        let runs: Vec<(u64, &[u8])> = rest
            .chunks(7919)
            .enumerate()
            .map(|(i, c)| (1000 + (i * 7919) as u64, c))
            .collect();
        for order in [
            (0..runs.len()).collect::<Vec<_>>(),
            (0..runs.len()).rev().collect(),
            (0..runs.len()).map(|i| (i * 5) % runs.len()).collect(),
        ] {
            let h = StreamHasher::new(prefix);
            for i in order {
                let (at, bytes) = runs[i];
                h.land(at, bytes);
            }
            assert_eq!(h.finish(data.len() as u64), Some(whole));
        }
        // A gap is not a digest.
        let h = StreamHasher::new(prefix);
        h.land(runs[1].0, runs[1].1);
        assert_eq!(h.finish(data.len() as u64), None);
        assert_eq!(hex(&StreamHasher::new(b"").finish(0).unwrap()), EMPTY);
        assert_eq!(hex(&StreamHasher::new(b"abc").finish(3).unwrap()), ABC);
    }

    #[test]
    fn in_order_takes_only_what_continues_it_and_hashes_as_the_whole() {
        let data: Vec<u8> = (0..50_000u32).map(|i| (i * 13 % 241) as u8).collect();
        let mut h = InOrder::new(Sha256::new(), 0);
        assert!(!h.take(5, &data[5..10]), "a gap is not taken");
        assert_eq!(h.next(), 0);
        for (i, run) in data.chunks(3331).enumerate() {
            assert!(h.take((i * 3331) as u64, run));
        }
        assert!(!h.take(0, &data[..1]), "bytes taken twice are not");
        assert_eq!(h.next(), data.len() as u64);
        let whole: Digest256 = Sha256::digest(&data).into();
        assert_eq!(
            Digest256::from(h.finish(data.len() as u64).unwrap().finalize()),
            whole
        );
        // From an offset: the hash of the bytes from there.
        let mut tail = InOrder::new(Sha256::new(), 1000);
        assert!(tail.take(1000, &data[1000..]));
        assert!(
            tail.clone().finish(data.len() as u64 - 1).is_none(),
            "not its end"
        );
        let expected: Digest256 = Sha256::digest(&data[1000..]).into();
        let finished = tail.finish(data.len() as u64).unwrap().finalize();
        assert_eq!(Digest256::from(finished), expected);
    }

    #[test]
    fn a_cache_blob_is_named_by_its_digest() {
        let blob = format!("/cache/models--org--m/blobs/{ABC}");
        assert_eq!(expected_from_cache(Path::new(&blob)), parse_hex(ABC));
        let not_blobs = format!("/cache/models--org--m/snapshots/{ABC}");
        assert_eq!(expected_from_cache(Path::new(&not_blobs)), None);
        assert_eq!(
            expected_from_cache(Path::new("/cache/blobs/model.safetensors")),
            None
        );
    }

    #[test]
    fn files_hash_like_the_reference() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..(9u32 << 20) + 17).map(|i| (i % 253) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let whole: Digest256 = Sha256::digest(&data).into();
        let file = std::fs::File::open(&path).unwrap();
        let source = crate::source::LocalFile::new(path.clone(), file, None).unwrap();
        assert_eq!(of_source(&source, data.len() as u64).unwrap(), whole);
        let map = crate::storage::map_file(source.file()).unwrap();
        assert_eq!(of_bytes(&map), whole);
        // Asking for more than the file has is the file ending early.
        let (at, e) = of_source(&source, data.len() as u64 + 1).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        assert!(at >= 8 << 20);
    }
}
