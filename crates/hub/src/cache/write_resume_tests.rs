//! The tests of a write resumed: what an earlier write left is adopted only where the file is the load's destination and proven by its digest before the load returns (fetched again where it fails), and never read as data otherwise.
use super::tests::{Folder, data, names, sha256_check};
use super::*;
use crate::os::Dir;
use crate::source::CacheWrite;
use std::sync::atomic::AtomicUsize;

/// A resumable write of `bytes` into `dir`.
fn resumable(dir: &std::path::Path, bytes: &[u8]) -> Arc<Write> {
    let target = Box::new(Folder {
        path: dir.to_path_buf(),
        begin_fails: None,
        resumable: true,
        gate: None,
    });
    Write::new(
        target,
        bytes.len() as u64,
        sha256_check(bytes),
        0,
        crate::cancel::Cancel::NONE,
    )
}

/// Lands `bytes[range]` in pieces of 1 MiB, as reads that missed the cache do.
fn land_range(write: &Write, bytes: &[u8], range: std::ops::Range<usize>) {
    for start in range.clone().step_by(1 << 20) {
        let end = (start + (1 << 20)).min(range.end);
        write.land(start as u64, &bytes[start..end]);
    }
}

/// Hands `write`'s file out as the load's destination (as `execute/cached.rs` does), said
/// to be mapped at addresses no buffer of a test has (past the user half of the address
/// space): every landing is then written to the file, and the kept bytes are in place.
fn as_destination(write: &Arc<Write>, len: usize) -> std::fs::File {
    let file = write
        .map_destination()
        .expect("the file as the destination");
    let far = usize::MAX / 2;
    write.mapped_at(far..far + len);
    file
}

/// A store that serves `bytes`, counting the bytes asked for.
struct Store<'a> {
    bytes: &'a [u8],
    asked: AtomicUsize,
}

impl Store<'_> {
    fn read(&self, at: u64, dst: &mut [u8]) -> io::Result<()> {
        let at = at as usize;
        dst.copy_from_slice(&self.bytes[at..at + dst.len()]);
        self.asked.fetch_add(dst.len(), Ordering::Relaxed);
        Ok(())
    }
}

#[test]
fn an_interrupted_write_is_resumed_from_its_finished_pieces_and_proven() {
    let piece = partial::PIECE as usize;
    let bytes = data(3 * piece + 12345);
    let temp = tempfile::tempdir().unwrap();
    let first = resumable(temp.path(), &bytes);
    assert!(first.local(0..1).is_none(), "nothing is kept yet");
    land_range(&first, &bytes, 0..piece + piece / 2);
    drop(first);
    let left = names(temp.path());
    assert!(
        left.contains(&"final.safeload-partial".to_owned()),
        "{left:?}"
    );
    assert!(
        left.contains(&"final.safeload-pieces".to_owned()),
        "{left:?}"
    );
    // The next write, its file the destination, keeps the finished piece in place.
    let second = resumable(temp.path(), &bytes);
    let _file = as_destination(&second, bytes.len());
    let local = second.local(0..bytes.len() as u64).unwrap();
    assert_eq!(local.ranges, vec![0..piece as u64]);
    let mut read = vec![0u8; piece];
    os::read_exact_at(&local.file, &mut read, 0).unwrap();
    assert!(read == bytes[..piece], "the kept piece's bytes");
    drop(local);
    land_range(&second, &bytes, piece..bytes.len());
    second.advance_now();
    // Complete, with bytes an earlier write left: nothing published before the proof.
    assert_eq!(second.outcome().as_str(), "checking");
    let store = Store {
        bytes: &bytes,
        asked: AtomicUsize::new(0),
    };
    second.prove(&|at, dst| store.read(at, dst)).unwrap();
    assert_eq!(store.asked.load(Ordering::Relaxed), 0, "the digest matched");
    assert_eq!(
        second.outcome(),
        CacheUse::Written {
            store: CacheStore::Directory,
            resumed: piece as u64,
            refetched: 0,
        }
    );
    assert_eq!(names(temp.path()), ["final", "final.lock"]);
    assert!(std::fs::read(temp.path().join("final")).unwrap() == bytes);
}

#[test]
fn kept_bytes_that_fail_the_digest_are_fetched_again_and_then_published() {
    let piece = partial::PIECE as usize;
    let bytes = data(3 * piece + 7);
    // A lying store's bytes, written and recorded by the first write (killed).
    let mut lie = bytes.clone();
    lie[piece / 2] ^= 0x5A;
    let temp = tempfile::tempdir().unwrap();
    let first = resumable(temp.path(), &bytes);
    land_range(&first, &lie, 0..2 * piece);
    drop(first);
    let second = resumable(temp.path(), &bytes);
    let file = as_destination(&second, bytes.len());
    land_range(&second, &bytes, 2 * piece..bytes.len());
    second.advance_now();
    let store = Store {
        bytes: &bytes,
        asked: AtomicUsize::new(0),
    };
    second.prove(&|at, dst| store.read(at, dst)).unwrap();
    // What the first write left, fetched again into the file the load views.
    assert_eq!(store.asked.load(Ordering::Relaxed), 2 * piece);
    let mut whole = vec![0u8; bytes.len()];
    os::read_exact_at(&file, &mut whole, 0).unwrap();
    assert!(whole == bytes, "the destination holds the store's bytes");
    assert_eq!(
        second.outcome(),
        CacheUse::Written {
            store: CacheStore::Directory,
            resumed: 0,
            refetched: 2 * piece as u64,
        }
    );
    assert!(std::fs::read(temp.path().join("final")).unwrap() == bytes);
}

#[test]
fn kept_bytes_that_cannot_be_fetched_again_fail_the_proof_and_nothing_is_published() {
    let piece = partial::PIECE as usize;
    let bytes = data(2 * piece + 3);
    let mut lie = bytes.clone();
    lie[9] ^= 1;
    let temp = tempfile::tempdir().unwrap();
    let first = resumable(temp.path(), &bytes);
    land_range(&first, &lie, 0..piece);
    drop(first);
    let second = resumable(temp.path(), &bytes);
    let _file = as_destination(&second, bytes.len());
    land_range(&second, &bytes, piece..bytes.len());
    second.advance_now();
    let broken = |_: u64, _: &mut [u8]| Err(io::Error::other("the store is gone"));
    assert!(second.prove(&broken).is_err(), "the load must fail");
    assert_eq!(second.outcome().as_str(), "not_cached");
    drop(second);
    assert_eq!(names(temp.path()), ["final.lock"]);
}

#[test]
fn a_write_that_is_not_the_destination_never_reads_what_an_earlier_one_left() {
    let piece = partial::PIECE as usize;
    let bytes = data(3 * piece);
    let temp = tempfile::tempdir().unwrap();
    let first = resumable(temp.path(), &bytes);
    land_range(&first, &bytes, 0..2 * piece);
    drop(first);
    // Read into the load's own buffers (a file converted, or read in part): the kept
    // pieces could not be proven before the load hands them out.
    let second = resumable(temp.path(), &bytes);
    assert!(second.local(0..bytes.len() as u64).is_none());
    land_range(&second, &bytes, 0..bytes.len());
    assert_eq!(
        second.outcome(),
        CacheUse::Written {
            store: CacheStore::Directory,
            resumed: 0,
            refetched: 2 * piece as u64,
        }
    );
}

#[test]
fn a_damaged_kept_piece_is_fetched_again_and_a_wrong_file_is_never_published() {
    let piece = partial::PIECE as usize;
    let bytes = data(2 * piece + 1);
    let temp = tempfile::tempdir().unwrap();
    let first = resumable(temp.path(), &bytes);
    land_range(&first, &bytes, 0..2 * piece);
    drop(first);
    let path = temp.path().join("final.safeload-partial");
    let mut damaged = std::fs::read(&path).unwrap();
    damaged[piece + 99] ^= 0x40;
    std::fs::write(&path, &damaged).unwrap();
    let second = resumable(temp.path(), &bytes);
    let _file = as_destination(&second, bytes.len());
    let local = second.local(0..bytes.len() as u64).unwrap();
    assert_eq!(
        local.ranges,
        vec![0..piece as u64],
        "the damaged piece is not kept"
    );
    land_range(&second, &bytes, piece..bytes.len());
    second
        .prove(&|_, _| unreachable!("the kept piece is sound"))
        .unwrap();
    assert_eq!(second.settled().as_str(), "written");
    assert!(std::fs::read(temp.path().join("final")).unwrap() == bytes);
    // Bytes that do not match the digest are never published, nor kept.
    let other = tempfile::tempdir().unwrap();
    let mut wrong = bytes.clone();
    wrong[5] ^= 1;
    let third = resumable(other.path(), &bytes);
    land_range(&third, &wrong, 0..wrong.len());
    assert_eq!(third.settled().as_str(), "not_cached");
    drop(third);
    assert_eq!(names(other.path()), ["final.lock"]);
}

#[test]
fn a_write_kept_whole_is_published_by_the_next_load_without_a_fetch() {
    let bytes = data(partial::PIECE as usize * 2);
    let temp = tempfile::tempdir().unwrap();
    let first = resumable(temp.path(), &bytes);
    first.pause();
    first.resume();
    // Every byte written but the write never finished (killed before publishing).
    let begun = first.map_destination();
    assert!(begun.is_some());
    for (i, part) in bytes.chunks(1 << 20).enumerate() {
        os::write_all_at(begun.as_ref().unwrap(), part, (i << 20) as u64).unwrap();
    }
    drop(first);
    let second = resumable(temp.path(), &bytes);
    assert!(
        second.local(0..bytes.len() as u64).is_none(),
        "nothing recorded"
    );
    drop(second);
    let third = resumable(temp.path(), &bytes);
    land_range(&third, &bytes, 0..bytes.len());
    drop(third);
    let fourth = resumable(temp.path(), &bytes);
    // Published by the third: read from there.
    let local = fourth.local(0..bytes.len() as u64).unwrap();
    assert_eq!(local.ranges, vec![0..bytes.len() as u64]);
    assert_eq!(fourth.settled().as_str(), "not_cached");
}

#[test]
fn a_file_resumed_whole_is_read_from_the_cache_while_it_is_proven_and_once_published() {
    let bytes = data(partial::PIECE as usize * 3 + 5);
    let len = bytes.len() as u64;
    for guarded in [false, true] {
        let temp = tempfile::tempdir().unwrap();
        // Every piece written and recorded, the file never published (a load killed
        // while its check ran).
        let dir = Dir::open(temp.path()).unwrap();
        let mut opened = partial::open(&dir, "final", len).unwrap();
        os::write_all_at(&opened.file, &bytes, 0).unwrap();
        let all = 0..len;
        let pieces = opened.log.finished(
            std::slice::from_ref(&all),
            all.clone(),
            &mut opened.recorded,
        );
        for index in pieces {
            let hash = partial::hash_piece(&opened.file, None, index, len).unwrap();
            opened.log.append(index, hash);
        }
        drop(opened);
        let write = resumable(temp.path(), &bytes);
        let guard = guarded.then(|| write.settle_on_drop());
        let _file = as_destination(&write, bytes.len());
        let whole = write.local(0..len).unwrap();
        assert_eq!(whole.ranges, vec![0..len]);
        // The read that found it whole completes it, and proves it.
        write.advance_now();
        for range in [0..len, 7..partial::PIECE + 9, len - 1..len] {
            let local = write
                .local(range.clone())
                .unwrap_or_else(|| panic!("{range:?} would be fetched ({guarded})"));
            assert_eq!(local.ranges, vec![range]);
        }
        write.prove(&|_, _| unreachable!("sound")).unwrap();
        drop(guard);
        assert_eq!(write.settled().as_str(), "written");
        let local = write.local(0..len).expect("published: still read from it");
        assert_eq!(local.ranges, vec![0..len]);
        assert_eq!(std::fs::read(temp.path().join("final")).unwrap(), bytes);
    }
}
