//! A download kept for the next load to resume: the file being written under a name of its final name's (`<name>.safeload-partial`, the same in every process), and a record of its finished pieces (`<name>.safeload-pieces`), both written only under the file's lock.
//!
//! Both are kept by a killed load; the next load of the file takes the lock
//! once the writer is gone, reads the recorded pieces that check and fetches
//! the rest. A piece is recorded after its bytes are written, so a power loss
//! may keep the record of lost pages: that piece fails its check and is
//! fetched again, and the whole file is checked before it is published.
//!
//! ```text
//! record = magic "SLPARTv1" | length u64 | piece u64 | entries
//! entry  = piece index u64 | XXH3-128 of the piece u128     (little-endian)
//! ```

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::time::SystemTime;

use xxhash_rust::xxh3::xxh3_128;

use crate::os::{self, Dir, EntryKind};

/// The bytes of a piece: the unit a partial file is recorded and resumed by.
///
/// NOTE: each reader leaves an unfinished piece at its frontier when the
/// load dies: 4 MiB pieces lost a quarter of what a load killed half way
/// had fetched, 1 MiB pieces a few percent (BENCHMARKS.md, "cache/partial.rs:
/// PIECE").
pub(crate) const PIECE: u64 = 1 << 20;
const MAGIC: &[u8; 8] = b"SLPARTv1";
const HEADER: usize = 24;
const ENTRY: usize = 24;
pub(crate) const PARTIAL_SUFFIX: &str = ".safeload-partial";
pub(crate) const PIECES_SUFFIX: &str = ".safeload-pieces";

pub(crate) fn partial_name(final_name: &str) -> String {
    format!("{final_name}{PARTIAL_SUFFIX}")
}

pub(crate) fn pieces_name(final_name: &str) -> String {
    format!("{final_name}{PIECES_SUFFIX}")
}

/// The final name a partial file or its record belongs to.
pub(crate) fn final_of(name: &str) -> Option<&str> {
    name.strip_suffix(PARTIAL_SUFFIX)
        .or_else(|| name.strip_suffix(PIECES_SUFFIX))
}

/// A partial file opened to be written on, under its lock: what an earlier load left of it.
pub(crate) struct Opened {
    pub file: Arc<File>,
    /// The pieces kept from an earlier load, checked.
    pub kept: Vec<Range<u64>>,
    pub recorded: BTreeSet<u64>,
    pub log: PieceLog,
}

/// Opens the partial file of `final_name` for `len` bytes under the caller's
/// lock, adopting the recorded pieces that check; `None` where the names are
/// not this user's regular files.
pub(crate) fn open(dir: &Dir, final_name: &str, len: u64) -> Option<Opened> {
    let (partial, pieces) = (partial_name(final_name), pieces_name(final_name));
    let file = own_file(dir, &partial)?;
    let record = own_file(dir, &pieces)?;
    let mut have = file.metadata().ok()?.len();
    if have > len {
        // Longer than the file: what is past it would be published with it.
        file.set_len(len).ok()?;
        have = len;
    }
    let mut kept = Vec::new();
    let mut recorded = BTreeSet::new();
    let mut entries = Vec::new();
    for (index, hash) in read_record(&record, len) {
        let range = piece(index, len);
        if range.end > have || recorded.contains(&index) {
            continue;
        }
        if hash_piece(&file, None, index, len) == Some(hash) {
            recorded.insert(index);
            entries.push((index, hash));
            kept.push(range);
        }
    }
    // The record rewritten with only what checked (under the lock).
    let mut image = header(len);
    for (index, hash) in &entries {
        image.extend_from_slice(&entry(*index, *hash));
    }
    record.set_len(0).ok()?;
    os::write_all_at(&record, &image, 0).ok()?;
    kept.sort_by_key(|r| r.start);
    Some(Opened {
        file: Arc::new(file),
        kept,
        recorded,
        log: PieceLog {
            record,
            end: image.len() as u64,
            len,
        },
    })
}

/// The file `name`, made where missing: `None` unless it is a regular file
/// of this user's, of one link (never written through another user's link).
fn own_file(dir: &Dir, name: &str) -> Option<File> {
    let file = dir.open_lock(name).ok()?;
    let meta = file.metadata().ok()?;
    let owner = os::file_owner(&meta);
    let own = owner.is_some() && owner == os::effective_uid();
    (own && os::link_count(&meta) == Some(1)).then_some(file)
}

fn header(len: u64) -> Vec<u8> {
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&len.to_le_bytes());
    bytes.extend_from_slice(&PIECE.to_le_bytes());
    bytes
}

fn entry(index: u64, hash: u128) -> [u8; ENTRY] {
    let mut bytes = [0u8; ENTRY];
    bytes[..8].copy_from_slice(&index.to_le_bytes());
    bytes[8..].copy_from_slice(&hash.to_le_bytes());
    bytes
}

fn pieces(len: u64) -> u64 {
    len.div_ceil(PIECE)
}

/// The byte range of piece `index` of a file of `len` bytes.
pub(super) fn piece(index: u64, len: u64) -> Range<u64> {
    let start = index.saturating_mul(PIECE).min(len);
    start..start.saturating_add(PIECE).min(len)
}

/// The record's entries, where it is one of a file of `len` bytes (a torn
/// last entry or a bad index left out; a bad header, all).
fn read_record(record: &File, len: u64) -> Vec<(u64, u128)> {
    let Ok(size) = record.metadata().map(|m| m.len()) else {
        return Vec::new();
    };
    let most = HEADER as u64 + 2 * pieces(len) * ENTRY as u64;
    if size < HEADER as u64 || size > most {
        return Vec::new();
    }
    let mut bytes = vec![0u8; size as usize];
    if os::read_exact_at(record, &mut bytes, 0).is_err() {
        return Vec::new();
    }
    let (head, entries) = bytes.split_at(HEADER);
    if head != header(len) {
        return Vec::new();
    }
    entries
        .chunks_exact(ENTRY)
        .filter_map(|e| {
            let (index, hash) = e.split_at(8);
            let index = u64::from_le_bytes(index.try_into().ok()?);
            let hash = u128::from_le_bytes(hash.try_into().ok()?);
            (index < pieces(len)).then_some((index, hash))
        })
        .collect()
}

/// The record of a partial file being written.
pub(crate) struct PieceLog {
    record: File,
    /// Where the next entry goes.
    end: u64,
    len: u64,
}

impl PieceLog {
    /// The pieces of `range` that `covered` (the bytes written) now holds
    /// whole, not yet in `recorded` (which they join).
    pub(crate) fn finished(
        &self,
        covered: &[Range<u64>],
        range: Range<u64>,
        recorded: &mut BTreeSet<u64>,
    ) -> Vec<u64> {
        let last = range.end.min(self.len).div_ceil(PIECE);
        (range.start / PIECE..last)
            .filter(|&index| {
                let piece = piece(index, self.len);
                let whole = covered
                    .iter()
                    .any(|c| c.start <= piece.start && piece.end <= c.end);
                whole && !piece.is_empty() && recorded.insert(index)
            })
            .collect()
    }

    /// Forgets every piece recorded: what an earlier load left is written over.
    pub(crate) fn forget_all(&mut self) {
        if self.record.set_len(HEADER as u64).is_ok() {
            self.end = HEADER as u64;
        }
    }

    /// Records piece `index`; a failure costs a later load this piece only.
    pub(crate) fn append(&mut self, index: u64, hash: u128) {
        if os::write_all_at(&self.record, &entry(index, hash), self.end).is_ok() {
            self.end += ENTRY as u64;
        }
    }
}

/// The hash of piece `index` of `file`: from `view` where it holds it, else read back.
pub(crate) fn hash_piece(
    file: &File,
    view: Option<&super::check::View>,
    index: u64,
    len: u64,
) -> Option<u128> {
    let range = piece(index, len);
    SCRATCH.with_borrow_mut(|scratch| {
        super::check::with_bytes((file, view), range, scratch, xxh3_128).ok()
    })
}

thread_local! {
    /// A piece read back, kept per thread: a fresh buffer costs its pages'
    /// first touch each time.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What tells a live writer from a dead one: its record's length and its
/// file's modification time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Activity {
    record: u64,
    modified: Option<SystemTime>,
}

impl Activity {
    /// The activity of a record of `record` bytes and a file changed at `modified`.
    #[cfg(test)]
    pub(crate) fn of(record: u64, modified: SystemTime) -> Activity {
        Activity {
            record,
            modified: Some(modified),
        }
    }

    pub(crate) fn pieces(&self) -> u64 {
        self.record.saturating_sub(HEADER as u64) / ENTRY as u64
    }

    /// Whether its record lists every piece of a file of `len` bytes.
    pub(crate) fn complete(&self, len: u64) -> bool {
        self.pieces() >= pieces(len)
    }
}

/// The activity of the writer of `final_name` in `dir`.
pub(crate) fn activity(dir: &Dir, final_name: &str) -> Activity {
    let record = match dir.entry(&pieces_name(final_name)) {
        Ok(EntryKind::File { len, .. }) => len,
        _ => 0,
    };
    let modified = match dir.entry(&partial_name(final_name)) {
        Ok(EntryKind::File { modified, .. }) => modified,
        _ => None,
    };
    Activity { record, modified }
}

/// Whether the record of `final_name`'s partial file lists a piece.
pub(crate) fn has_pieces(dir: &Dir, final_name: &str) -> bool {
    matches!(dir.entry(&pieces_name(final_name)),
        Ok(EntryKind::File { len, .. }) if len > HEADER as u64)
}

/// Removes the partial file of `final_name` and its record.
pub(crate) fn remove(dir: &Dir, final_name: &str) -> io::Result<()> {
    let _ = dir.remove(&pieces_name(final_name));
    dir.remove(&partial_name(final_name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> (tempfile::TempDir, Dir) {
        let temp = tempfile::tempdir().unwrap();
        let dir = Dir::open(temp.path()).unwrap();
        (temp, dir)
    }

    /// Writes `bytes` up to `upto` into the partial file, recording the pieces finished.
    fn write_logged(dir: &Dir, bytes: &[u8], upto: usize) {
        let mut opened = open(dir, "blob", bytes.len() as u64).unwrap();
        os::write_all_at(&opened.file, &bytes[..upto], 0).unwrap();
        let written = 0..upto as u64;
        let finished = opened.log.finished(
            std::slice::from_ref(&written),
            written.clone(),
            &mut opened.recorded,
        );
        for index in finished {
            let hash = hash_piece(&opened.file, None, index, bytes.len() as u64).unwrap();
            opened.log.append(index, hash);
        }
    }

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[test]
    fn a_piece_hashed_from_a_map_of_the_file_is_hashed_as_read_back() {
        let (_t, dir) = dir();
        let bytes = data((2 * PIECE + 7) as usize);
        let len = bytes.len() as u64;
        let opened = open(&dir, "blob", len).unwrap();
        os::write_all_at(&opened.file, &bytes, 0).unwrap();
        let view = super::super::check::View::of(&opened.file, len).unwrap();
        for index in 0..3 {
            let mapped = hash_piece(&opened.file, Some(&view), index, len);
            assert_eq!(mapped, hash_piece(&opened.file, None, index, len));
            let range = piece(index, len);
            let own = xxh3_128(&bytes[range.start as usize..range.end as usize]);
            assert_eq!(mapped, Some(own));
        }
        // A map of another length is not used.
        assert!(super::super::check::View::of(&opened.file, len + 1).is_none());
    }

    #[test]
    fn finished_pieces_are_kept_and_the_unfinished_one_is_not() {
        let (_t, dir) = dir();
        let bytes = data((2 * PIECE + PIECE / 2) as usize);
        write_logged(&dir, &bytes, (PIECE + PIECE / 2) as usize);
        let opened = open(&dir, "blob", bytes.len() as u64).unwrap();
        assert_eq!(opened.kept, vec![0..PIECE]);
    }

    #[test]
    fn a_flipped_byte_drops_its_piece_and_the_record_forgets_it() {
        let (temp, dir) = dir();
        let bytes = data((3 * PIECE) as usize);
        write_logged(&dir, &bytes, bytes.len());
        let path = temp.path().join(partial_name("blob"));
        let mut damaged = std::fs::read(&path).unwrap();
        damaged[(PIECE + 7) as usize] ^= 1;
        std::fs::write(&path, &damaged).unwrap();
        let opened = open(&dir, "blob", bytes.len() as u64).unwrap();
        assert_eq!(opened.kept, vec![0..PIECE, 2 * PIECE..3 * PIECE]);
        drop(opened);
        let again = open(&dir, "blob", bytes.len() as u64).unwrap();
        assert_eq!(again.kept, vec![0..PIECE, 2 * PIECE..3 * PIECE]);
    }

    #[test]
    fn a_record_of_another_length_or_garbage_keeps_nothing() {
        let (temp, dir) = dir();
        let bytes = data((2 * PIECE) as usize);
        write_logged(&dir, &bytes, bytes.len());
        assert!(
            open(&dir, "blob", bytes.len() as u64 + 1)
                .unwrap()
                .kept
                .is_empty()
        );
        let record = temp.path().join(pieces_name("blob"));
        std::fs::write(&record, b"not a record").unwrap();
        assert!(
            open(&dir, "blob", bytes.len() as u64)
                .unwrap()
                .kept
                .is_empty()
        );
        // A torn last entry is left out, the rest kept.
        write_logged(&dir, &bytes, bytes.len());
        let mut text = std::fs::read(&record).unwrap();
        text.truncate(text.len() - 3);
        std::fs::write(&record, &text).unwrap();
        assert_eq!(
            open(&dir, "blob", bytes.len() as u64).unwrap().kept,
            vec![0..PIECE]
        );
    }

    #[test]
    fn a_partial_file_with_another_name_is_never_written_through() {
        let (temp, dir) = dir();
        let victim = temp.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::fs::hard_link(&victim, temp.path().join(partial_name("blob"))).unwrap();
        assert!(open(&dir, "blob", 4 << 20).is_none());
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    }

    #[test]
    fn names_lead_back_to_their_final_name() {
        assert_eq!(final_of(&partial_name("abc")), Some("abc"));
        assert_eq!(final_of(&pieces_name("abc")), Some("abc"));
        assert_eq!(final_of("abc.incomplete"), None);
    }
}
