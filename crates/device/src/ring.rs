//! The staging ring of a load to a device: a few buffers made on demand up to the ring's size, each filled in disjoint pieces by several readers at once (`Staged`), handed whole to the device's copy once every piece is in, and taken back when the copy completes.
//!
//! The ring is bookkeeping only: the load (`pipeline.rs`) keeps it
//! under its one lock with the chunks it schedules, and waits on the
//! device outside that lock.

use std::collections::VecDeque;
use std::io;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::device::Device;

/// A copy in flight, and the file it moves bytes of: for the report.
pub(crate) struct InFlight<C> {
    pub copy: C,
    /// The file (an index into the load's list) its bytes are of.
    pub file: usize,
}

/// The buffers of one load: those free, how many were made, the copies in
/// flight (each holding its buffer) in the order they were submitted.
pub(crate) struct Ring<D: Device> {
    capacity: usize,
    buffer_len: usize,
    free: Vec<D::Staging>,
    made: usize,
    in_flight: VecDeque<InFlight<D::Copy>>,
    /// Whether a thread is waiting for the oldest copy (only one does: the
    /// others wait for what it gives back).
    reaping: bool,
}

impl<D: Device> Ring<D> {
    /// A ring of at most `capacity` buffers of `buffer_len` bytes, none made
    /// yet.
    pub(crate) fn new(capacity: usize, buffer_len: usize) -> Ring<D> {
        Ring {
            capacity: capacity.max(1),
            buffer_len,
            free: Vec::new(),
            made: 0,
            in_flight: VecDeque::new(),
            reaping: false,
        }
    }

    /// A buffer to fill now: a free one, else a new one while fewer than the
    /// ring's size were made (the device's error where it cannot make it);
    /// `None` when every buffer is filling or copying.
    pub(crate) fn take(&mut self, device: &D) -> Option<io::Result<D::Staging>> {
        if let Some(buffer) = self.free.pop() {
            return Some(Ok(buffer));
        }
        if self.made < self.capacity {
            self.made += 1;
            return Some(device.staging(self.buffer_len));
        }
        None
    }

    /// A copy submitted: its buffer comes back when it completes.
    pub(crate) fn submitted(&mut self, copy: InFlight<D::Copy>) {
        self.in_flight.push_back(copy);
    }

    /// The oldest copy for this thread to wait for, where no other thread
    /// waits for one; [`reaped`](Self::reaped) must follow.
    pub(crate) fn reap(&mut self) -> Option<InFlight<D::Copy>> {
        if self.reaping {
            return None;
        }
        let oldest = self.in_flight.pop_front()?;
        self.reaping = true;
        Some(oldest)
    }

    /// The wait of [`reap`](Self::reap) is over: its buffer, where the copy
    /// completed, is free again.
    pub(crate) fn reaped(&mut self, buffer: Option<D::Staging>) {
        self.reaping = false;
        self.free.extend(buffer);
    }

    /// Every copy still in flight, oldest first, for the load's end.
    pub(crate) fn drain(&mut self) -> Vec<InFlight<D::Copy>> {
        self.in_flight.drain(..).collect()
    }
}

/// A staging buffer being filled: disjoint pieces of it, each written once
/// by whichever reader takes it, the buffer handed on whole once every
/// piece is in.
///
/// The buffer is owned here (boxed, so that its bytes do not move) from
/// [`new`](Self::new) until the last piece's [`fill`](Self::fill) takes it
/// out, or until this is dropped; its bytes are reached only through the
/// pieces, each by one writer, and the buffer itself only after every
/// piece's writer has returned.
pub(crate) struct Staged<S> {
    /// The buffer, from `Box::into_raw`; taken (set to `None`) by the last
    /// piece, else freed on drop.
    staging: std::sync::Mutex<Option<NonNull<S>>>,
    /// Its bytes, as `staging_bytes` gave them.
    bytes: NonNull<u8>,
    len: usize,
    pieces: Box<[Range<usize>]>,
    /// Whether each piece was handed to a writer.
    claimed: Box<[AtomicBool]>,
    /// Pieces not yet written.
    left: AtomicUsize,
}

// SAFETY: `Staged` owns an `S` (moved across threads only when `S: Send`)
// and hands out its bytes as disjoint `&mut [u8]`, each piece at most once
// (`claimed`), the buffer itself only after every piece's writer returned
// (`left`); nothing else reaches either through a shared reference.
unsafe impl<S: Send> Send for Staged<S> {}
// SAFETY: as above: what `&Staged` allows from several threads is claiming
// distinct pieces (an atomic swap each) and, once, taking the buffer.
unsafe impl<S: Send> Sync for Staged<S> {}

impl<S> Staged<S> {
    /// `staging`, whose bytes `bytes` gives, to be filled in `pieces`:
    /// ranges of those bytes in increasing order, disjoint, inside them.
    /// `None` (and the buffer dropped) where the pieces are not that.
    pub(crate) fn new(
        staging: S,
        bytes: impl FnOnce(&mut S) -> &mut [u8],
        pieces: Vec<Range<usize>>,
    ) -> Option<Staged<S>> {
        let raw = NonNull::from(Box::leak(Box::new(staging)));
        // SAFETY: `raw` comes from a box made just now and not yet shared:
        // this is its only reference, and it ends with this statement (the
        // slice's address is all that is kept of it).
        let slice = bytes(unsafe { &mut *raw.as_ptr() });
        let (ptr, len) = (NonNull::from(&mut *slice).cast::<u8>(), slice.len());
        let ordered = pieces
            .iter()
            .try_fold(0, |end, p| {
                (end <= p.start && p.start <= p.end).then_some(p.end)
            })
            .is_some_and(|end| end <= len);
        let staged = Staged {
            staging: std::sync::Mutex::new(Some(raw)),
            bytes: ptr,
            len,
            claimed: pieces.iter().map(|_| AtomicBool::new(false)).collect(),
            left: AtomicUsize::new(pieces.len()),
            pieces: pieces.into_boxed_slice(),
        };
        // Dropped (and the buffer with it) where the pieces are not fit.
        ordered.then_some(staged)
    }

    /// The buffer's length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Writes piece `piece` with `write`, once: `None` where there is no
    /// such piece or it was written (or is being written) already. Where
    /// `write` succeeds and it was the last piece, the buffer comes back
    /// with its result, to be handed on; where it fails, the piece stays
    /// unwritten and the buffer is never handed on (it is dropped with
    /// this).
    pub(crate) fn fill<T, E>(
        &self,
        piece: usize,
        write: impl FnOnce(&mut [u8]) -> Result<T, E>,
    ) -> Option<Result<(T, Option<S>), E>> {
        let range = self.pieces.get(piece)?.clone();
        if self.claimed.get(piece)?.swap(true, Ordering::AcqRel) {
            return None;
        }
        // SAFETY: `range` lies within the `len` bytes at `bytes` (checked in
        // `new`), which stay where they are while the buffer is owned here
        // (boxed, and not reached otherwise until every piece is written);
        // the pieces are disjoint and this one is claimed by this call only
        // (the swap above), so this is the only reference to these bytes.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(self.bytes.as_ptr().add(range.start), range.len())
        };
        let value = match write(dst) {
            Ok(value) => value,
            Err(e) => return Some(Err(e)),
        };
        // The last piece's writer (the others' writes happened before their
        // decrements, which this one acquires) takes the buffer.
        let last = self.left.fetch_sub(1, Ordering::AcqRel) == 1;
        Some(Ok((value, if last { self.take() } else { None })))
    }

    /// The buffer, out of this (once).
    fn take(&self) -> Option<S> {
        let raw = self
            .staging
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()?;
        // SAFETY: `raw` came from `Box::leak` in `new` and is taken out of
        // the mutex once, here or in `drop`; every piece's writer has
        // returned (the caller is the last), so no reference to the bytes
        // is left.
        Some(*unsafe { Box::from_raw(raw.as_ptr()) })
    }
}

impl<S> Drop for Staged<S> {
    fn drop(&mut self) {
        // A buffer whose pieces did not all arrive: freed (given back to
        // the device that made it).
        drop(self.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(pieces: Vec<Range<usize>>) -> Option<Staged<Vec<u8>>> {
        Staged::new(vec![0u8; 16], |v| v.as_mut_slice(), pieces)
    }

    #[test]
    fn pieces_out_of_order_overlapping_or_outside_are_refused() {
        assert!(staged(vec![0..4, 4..16]).is_some());
        assert!(staged(vec![]).is_some());
        assert!(staged(vec![4..8, 0..4]).is_none());
        assert!(staged(vec![0..5, 4..8]).is_none());
        assert!(staged(vec![0..8, 9..17]).is_none());
    }

    #[test]
    fn every_piece_is_written_once_and_the_last_writer_gets_the_buffer() {
        let s = staged(vec![0..4, 4..8, 10..16]).unwrap();
        let put = |v: u8| {
            move |dst: &mut [u8]| -> Result<(), ()> {
                dst.fill(v);
                Ok(())
            }
        };
        let (_, none) = s.fill(1, put(2)).unwrap().unwrap();
        assert!(none.is_none());
        assert!(s.fill(1, put(9)).is_none(), "a piece written twice");
        assert!(s.fill(3, put(9)).is_none(), "no such piece");
        // A failed piece stays unwritten: the buffer is not handed on.
        assert!(s.fill(0, |_| Err::<(), _>("failed")).unwrap().is_err());
        let (_, none) = s.fill(2, put(3)).unwrap().unwrap();
        assert!(none.is_none());
        drop(s);

        let s = staged(vec![0..4, 4..8]).unwrap();
        assert!(s.fill(0, put(1)).unwrap().unwrap().1.is_none());
        let buffer = s.fill(1, put(2)).unwrap().unwrap().1.unwrap();
        assert_eq!(&buffer[..10], &[1, 1, 1, 1, 2, 2, 2, 2, 0, 0]);
    }

    #[test]
    fn pieces_written_from_many_threads_land_where_they_belong() {
        let pieces: Vec<Range<usize>> = (0..64).map(|i| i * 16..i * 16 + 15).collect();
        let s = Staged::new(vec![0u8; 1024], |v| v.as_mut_slice(), pieces).unwrap();
        let got = std::sync::Mutex::new(None);
        std::thread::scope(|scope| {
            for t in 0..4 {
                let (s, got) = (&s, &got);
                scope.spawn(move || {
                    for i in (t..64).step_by(4) {
                        let (_, last) = s
                            .fill(i, |dst| {
                                dst.fill(i as u8);
                                Ok::<_, ()>(())
                            })
                            .unwrap()
                            .unwrap();
                        if let Some(buffer) = last {
                            *got.lock().unwrap() = Some(buffer);
                        }
                    }
                });
            }
        });
        let buffer = got.into_inner().unwrap().unwrap();
        for i in 0..64 {
            assert!(buffer[i * 16..i * 16 + 15].iter().all(|&b| b == i as u8));
            assert_eq!(buffer[i * 16 + 15], 0);
        }
    }
}
