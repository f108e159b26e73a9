//! The pieces of a partial file hashed as their bytes land, in order, while they are still in the CPU's cache: the hash its record needs once the piece is finished, without reading the piece again.
//!
//! NOTE: hashed once finished, each piece was read again out of the CPU's caches: its XXH3
//! took a fifth of the copy fill's CPU time (BENCHMARKS.md, "cache/streams.rs: the
//! module"). A piece whose bytes do not land in order is still hashed from the file.

use std::collections::HashMap;
use std::ops::Range;

use xxhash_rust::xxh3::Xxh3;

use super::partial::{PIECE, piece};
use crate::verify::InOrder;

/// A piece's XXH3-128, as the in-order hasher takes it.
pub(crate) struct PieceHash(Xxh3);

impl sha2::digest::Update for PieceHash {
    fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// Where each piece being streamed is.
#[derive(Default)]
pub(crate) struct Streams {
    pieces: HashMap<u64, Stream>,
}

enum Stream {
    /// Hashed in order from the piece's start (boxed: an XXH3 state is large).
    Open(Box<InOrder<'static, PieceHash>>),
    /// Being hashed by a read, outside the write's lock.
    Taken,
    /// Its bytes landed out of order: hashed from the file once finished.
    Broken,
    Done(u128),
}

/// A piece's hash taken out to go on over the file to `end`.
pub(crate) struct Taken {
    index: u64,
    end: u64,
    hash: Box<InOrder<'static, PieceHash>>,
}

impl Streams {
    /// Takes out the hashes `range` (about to land) goes on from, for a file of `len`
    /// bytes; any other piece it touches is hashed from the file instead.
    pub(crate) fn take(&mut self, range: Range<u64>, len: u64) -> Vec<Taken> {
        let mut taken = Vec::new();
        let last = range.end.min(len).div_ceil(PIECE);
        for index in range.start / PIECE..last {
            let whole = piece(index, len);
            let part = whole.start.max(range.start)..whole.end.min(range.end);
            if part.is_empty() {
                continue;
            }
            let hash = match self.pieces.remove(&index) {
                None => Some(Box::new(InOrder::new(PieceHash(Xxh3::new()), whole.start))),
                Some(Stream::Open(hash)) => Some(hash),
                _ => None,
            };
            match hash.filter(|h| h.next() == part.start) {
                Some(hash) => {
                    self.pieces.insert(index, Stream::Taken);
                    let end = part.end;
                    taken.push(Taken { index, end, hash });
                }
                None => {
                    self.pieces.insert(index, Stream::Broken);
                }
            }
        }
        taken
    }

    /// Puts back what [`hash`] went on with; one another read broke meanwhile stays broken.
    pub(crate) fn put(&mut self, taken: Vec<Taken>, len: u64) {
        for Taken { index, end, hash } in taken {
            if !matches!(self.pieces.get(&index), Some(Stream::Taken)) {
                continue;
            }
            let stream = match hash.next() {
                next if next == piece(index, len).end => {
                    Stream::Done(hash.into_inner().0.digest128())
                }
                next if next == end => Stream::Open(hash),
                // A part that did not land whole.
                _ => Stream::Broken,
            };
            self.pieces.insert(index, stream);
        }
    }

    /// The hash of finished piece `index`, where streamed whole (forgotten either way).
    pub(crate) fn finished(&mut self, index: u64) -> Option<u128> {
        match self.pieces.remove(&index) {
            Some(Stream::Done(hash)) => Some(hash),
            _ => None,
        }
    }
}

/// Goes on with each taken hash over its part of `bytes` (at `offset`), outside the lock.
pub(crate) fn hash(taken: &mut [Taken], bytes: &[u8], offset: u64) {
    for t in taken {
        let at = t.hash.next();
        let from = usize::try_from(at - offset).ok();
        let to = usize::try_from(t.end - offset).ok();
        if let Some(part) = from.zip(to).and_then(|(from, to)| bytes.get(from..to)) {
            t.hash.take(at, part);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xxhash_rust::xxh3::xxh3_128;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 131 % 253) as u8).collect()
    }

    fn land(streams: &mut Streams, bytes: &[u8], range: Range<u64>) {
        let len = bytes.len() as u64;
        let mut taken = streams.take(range.clone(), len);
        let part = &bytes[range.start as usize..range.end as usize];
        hash(&mut taken, part, range.start);
        streams.put(taken, len);
    }

    fn own(bytes: &[u8], index: u64) -> u128 {
        let range = piece(index, bytes.len() as u64);
        xxh3_128(&bytes[range.start as usize..range.end as usize])
    }

    #[test]
    fn pieces_landed_in_order_in_any_steps_hash_as_a_whole() {
        let bytes = data((3 * PIECE + 12345) as usize);
        let len = bytes.len() as u64;
        let mut streams = Streams::default();
        // Steps that cross pieces' ends and stop short of them.
        let mut at = 0;
        for step in [7u64, 300_000, PIECE, 2 * PIECE - 5, PIECE] {
            let end = (at + step).min(len);
            land(&mut streams, &bytes, at..end);
            at = end;
        }
        assert_eq!(at, len);
        for index in 0..4 {
            assert_eq!(streams.finished(index), Some(own(&bytes, index)), "{index}");
        }
        assert!(streams.pieces.is_empty());
    }

    #[test]
    fn a_piece_landed_out_of_order_or_twice_is_left_to_the_file() {
        let bytes = data((3 * PIECE) as usize);
        let mut streams = Streams::default();
        // Piece 0: its second half first.
        land(&mut streams, &bytes, PIECE / 2..PIECE);
        land(&mut streams, &bytes, 0..PIECE / 2);
        // Piece 1: its start landed twice.
        land(&mut streams, &bytes, PIECE..PIECE + 10);
        land(&mut streams, &bytes, PIECE..2 * PIECE);
        // Piece 2: in order.
        land(&mut streams, &bytes, 2 * PIECE..3 * PIECE);
        assert_eq!(streams.finished(0), None);
        assert_eq!(streams.finished(1), None);
        assert_eq!(streams.finished(2), Some(own(&bytes, 2)));
    }

    #[test]
    fn a_read_meeting_a_piece_another_has_taken_breaks_it() {
        let bytes = data((2 * PIECE) as usize);
        let len = bytes.len() as u64;
        let mut streams = Streams::default();
        let mut first = streams.take(0..PIECE / 2, len);
        // Another read lands the rest while the first hashes.
        land(&mut streams, &bytes, PIECE / 2..PIECE);
        hash(&mut first, &bytes[..(PIECE / 2) as usize], 0);
        streams.put(first, len);
        assert_eq!(streams.finished(0), None);
    }
}
