//! A load to a device as a source of the read loop: readers take the pieces of the open chunks in file order, open the next chunk when a staging buffer is free, wait for the oldest copy when none is, and hand each filled buffer to the device's copy; what each file's bytes cost, for the report.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use safeload_core::cancel::{self, Cancel};
use safeload_core::dest::device::{DeviceFile, let_go};
use safeload_core::error::Operation;
use safeload_core::jobs::JobSource;

use crate::device::Device;
use crate::plan::{self, Chunk, Piece};
use crate::ring::{InFlight, Ring, Staged};

/// A file as the load goes: what the core planned, its slab's layout and
/// the slab.
pub(super) struct Placing<'a, D: Device> {
    pub file: DeviceFile<'a>,
    pub layout: plan::Slab,
    pub slab: Arc<D::Slab>,
}

/// What a file's pieces and copies cost so far.
#[derive(Default)]
pub(super) struct FileCost {
    pub bytes_read: AtomicU64,
    pub chunks: AtomicUsize,
    pub overflowed: AtomicU64,
    /// Nanoseconds from the load's start: its first piece began (`u64::MAX`
    /// before), its last copy completed.
    pub first: AtomicU64,
    pub last: AtomicU64,
}

impl FileCost {
    pub(super) fn new() -> FileCost {
        FileCost {
            first: AtomicU64::new(u64::MAX),
            ..FileCost::default()
        }
    }

    /// From its first piece to its last copy.
    pub(super) fn elapsed(&self) -> Duration {
        let (first, last) = (
            self.first.load(Ordering::Relaxed),
            self.last.load(Ordering::Relaxed),
        );
        Duration::from_nanos(last.saturating_sub(first))
    }
}

/// Why the load stopped, and where.
#[derive(Debug)]
pub(super) struct Failure {
    /// The file (an index into the load's list), where one is to blame.
    pub file: Option<usize>,
    pub operation: Operation,
    pub offset: Option<u64>,
    pub error: io::Error,
    /// Whether the device failed (the file's source did not).
    pub device: bool,
}

impl Failure {
    fn device(file: Option<usize>, offset: Option<u64>, error: io::Error) -> Failure {
        let operation = Operation::Device;
        let device = true;
        Failure {
            file,
            operation,
            offset,
            error,
            device,
        }
    }

    fn internal(what: &str) -> Failure {
        let e = io::Error::other(format!("a load to a device went wrong: {what}"));
        Failure::device(None, None, e)
    }
}

/// The work a reader takes: a piece of an open chunk, or the failure it is
/// to report (a staging buffer that could not be made, a copy that failed).
pub(super) enum Work<S> {
    Piece {
        reader: usize,
        chunk: usize,
        piece: usize,
        staged: Arc<Staged<S>>,
    },
    Failed(Failure),
}

/// A chunk whose buffer is being filled, and its next piece to hand out.
struct Open<S> {
    chunk: usize,
    next_piece: usize,
    staged: Arc<Staged<S>>,
}

/// What the readers share, under one lock: the ring, the next chunk, the
/// open chunks.
struct State<D: Device> {
    ring: Ring<D>,
    next_chunk: usize,
    open: VecDeque<Open<D::Staging>>,
    handed: usize,
    /// Chunks whose copy was submitted.
    submitted: usize,
    stopped: bool,
}

/// A load's pieces, chunks and copies.
pub(super) struct Pipeline<'a, D: Device> {
    device: &'a D,
    files: &'a [Placing<'a, D>],
    chunks: &'a [Chunk],
    state: Mutex<State<D>>,
    changed: Condvar,
    /// Each reader's buffer for merged reads and conversions from a file
    /// that is read (never from a map): dropped with the load.
    scratch: Vec<Mutex<Vec<u8>>>,
    cancel: &'a Cancel,
    clock: Instant,
    pub costs: Vec<FileCost>,
}

impl<'a, D: Device> Pipeline<'a, D> {
    pub(super) fn new(
        device: &'a D,
        files: &'a [Placing<'a, D>],
        chunks: &'a [Chunk],
        ring: Ring<D>,
        readers: usize,
        clock: Instant,
        cancel: &'a Cancel,
    ) -> Pipeline<'a, D> {
        Pipeline {
            device,
            files,
            chunks,
            state: Mutex::new(State {
                ring,
                next_chunk: 0,
                open: VecDeque::new(),
                handed: 0,
                submitted: 0,
                stopped: false,
            }),
            changed: Condvar::new(),
            scratch: (0..readers.max(1))
                .map(|_| Mutex::new(Vec::new()))
                .collect(),
            cancel,
            clock,
            costs: files.iter().map(|_| FileCost::new()).collect(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State<D>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> u64 {
        u64::try_from(self.clock.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Wakes every reader waiting in `next`, none to take more.
    fn stop(&self) {
        self.state().stopped = true;
        self.changed.notify_all();
    }

    /// A copy completed: its file's count and time.
    fn copied(&self, file: usize) {
        if let Some(cost) = self.costs.get(file) {
            cost.chunks.fetch_add(1, Ordering::Relaxed);
            cost.last.fetch_max(self.now(), Ordering::Relaxed);
        }
    }

    /// Waits for every copy still in flight (after the readers are done,
    /// whatever became of them), so that no slab is freed under a copy;
    /// the first failure among them, and whether every chunk was copied.
    pub(super) fn finish(&self) -> Result<(), Failure> {
        let left = self.state().ring.drain();
        let mut failed = None;
        for InFlight { copy, file, .. } in left {
            match self.device.complete(copy) {
                Ok(_buffer) => self.copied(file),
                Err(e) => _ = failed.get_or_insert(Failure::device(Some(file), None, e)),
            }
        }
        if let Some(failure) = failed {
            return Err(failure);
        }
        if self.state().submitted != self.chunks.len() {
            return Err(Failure::internal("chunks were left uncopied"));
        }
        Ok(())
    }

    /// The next piece to hand out, opening the next chunk or waiting for a
    /// copy where none is; `None` once none is left.
    fn next_piece(&self, reader: usize) -> Option<(usize, Work<D::Staging>)> {
        let mut state = self.state();
        loop {
            if state.stopped {
                return None;
            }
            if self.cancel.is_set() {
                drop(state);
                self.stop();
                return Some((usize::MAX, Work::Failed(stopped())));
            }
            if let Some(work) = self.hand_out(&mut state, reader) {
                return Some(work);
            }
            let fail = |state: &mut State<D>, failure| {
                state.stopped = true;
                self.changed.notify_all();
                Some((usize::MAX, Work::Failed(failure)))
            };
            if state.next_chunk < self.chunks.len() {
                if let Some(taken) = state.ring.take(self.device) {
                    let allocate = |e| Failure {
                        operation: Operation::Allocate,
                        ..Failure::device(None, None, e)
                    };
                    let opened = taken
                        .map_err(allocate)
                        .and_then(|buffer| self.open(&mut state, buffer));
                    match opened {
                        Ok(()) => continue,
                        Err(failure) => return fail(&mut state, failure),
                    }
                }
            } else if state.open.is_empty() {
                return None;
            }
            if let Some(oldest) = state.ring.reap() {
                drop(state);
                let done = self.device.complete(oldest.copy);
                state = self.state();
                match done {
                    Ok(buffer) => {
                        state.ring.reaped(Some(buffer));
                        self.changed.notify_all();
                        self.copied(oldest.file);
                    }
                    Err(e) => {
                        state.ring.reaped(None);
                        return fail(&mut state, Failure::device(Some(oldest.file), None, e));
                    }
                }
                continue;
            }
            state = self
                .changed
                .wait_timeout(state, Duration::from_millis(20))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// The next piece of an open chunk, if one is left to hand out.
    fn hand_out(&self, state: &mut State<D>, reader: usize) -> Option<(usize, Work<D::Staging>)> {
        while let Some(front) = state.open.front() {
            let left = self
                .chunks
                .get(front.chunk)
                .is_some_and(|c| front.next_piece < c.pieces.len());
            if left {
                break;
            }
            state.open.pop_front();
        }
        let open = state.open.iter_mut().find(|o| {
            self.chunks
                .get(o.chunk)
                .is_some_and(|c| o.next_piece < c.pieces.len())
        })?;
        let work = Work::Piece {
            reader,
            chunk: open.chunk,
            piece: open.next_piece,
            staged: Arc::clone(&open.staged),
        };
        open.next_piece += 1;
        state.handed += 1;
        Some((state.handed, work))
    }

    /// Opens the next chunk with `buffer`.
    fn open(&self, state: &mut State<D>, buffer: D::Staging) -> Result<(), Failure> {
        let index = state.next_chunk;
        let chunk = self
            .chunks
            .get(index)
            .ok_or_else(|| Failure::internal("no chunk to open"))?;
        let pieces = chunk.pieces.iter().map(|p| p.dst.clone()).collect();
        let device = self.device;
        let staged = Staged::new(buffer, |b| device.staging_bytes(b), pieces)
            .filter(|s| s.len() >= chunk.slab.len())
            .ok_or_else(|| Failure::internal("a chunk does not fit its staging buffer"))?;
        state.next_chunk += 1;
        state.open.push_back(Open {
            chunk: index,
            next_piece: 0,
            staged: Arc::new(staged),
        });
        Ok(())
    }

    /// Fills one piece; where it was the chunk's last, submits the chunk's
    /// copy.
    fn run_piece(
        &self,
        reader: usize,
        chunk: usize,
        piece: usize,
        staged: &Staged<D::Staging>,
    ) -> Result<u64, Failure> {
        let (Some(c), Some(p)) = (
            self.chunks.get(chunk),
            self.chunks.get(chunk).and_then(|c| c.pieces.get(piece)),
        ) else {
            return Err(Failure::internal("no such piece"));
        };
        let (file, cost) = match (self.files.get(c.file), self.costs.get(c.file)) {
            (Some(f), Some(cost)) => (f, cost),
            _ => return Err(Failure::internal("no such file")),
        };
        cost.first.fetch_min(self.now(), Ordering::Relaxed);
        let mut scratch = self
            .scratch
            .get(reader % self.scratch.len().max(1))
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner));
        let filled = staged.fill(piece, |dst| {
            fill(&file.file, p, dst, scratch.as_deref_mut()).map_err(
                |(operation, offset, error)| Failure {
                    file: Some(c.file),
                    operation,
                    offset: Some(offset),
                    error,
                    device: false,
                },
            )
        });
        drop(scratch);
        let ((read, overflowed), buffer) =
            filled.ok_or_else(|| Failure::internal("a piece taken twice"))??;
        cost.bytes_read.fetch_add(read, Ordering::Relaxed);
        cost.overflowed.fetch_add(overflowed, Ordering::Relaxed);
        if let Some(buffer) = buffer {
            self.submit(c, buffer)?;
        }
        Ok(read)
    }

    /// Hands chunk `c`'s filled buffer to the device's copy.
    fn submit(&self, c: &Chunk, buffer: D::Staging) -> Result<(), Failure> {
        let slab = self
            .files
            .get(c.file)
            .map(|f| &*f.slab)
            .ok_or_else(|| Failure::internal("a chunk of no file"))?;
        let len = c.slab.len();
        let copy = self
            .device
            .submit(buffer, len, slab, c.slab.start)
            .map_err(|e| Failure::device(Some(c.file), Some(c.slab.start as u64), e))?;
        let mut state = self.state();
        state.ring.submitted(InFlight { copy, file: c.file });
        state.submitted += 1;
        drop(state);
        self.changed.notify_all();
        Ok(())
    }
}

impl<'a, D: Device> JobSource for Pipeline<'a, D> {
    type Job = Work<D::Staging>;
    type Error = Failure;

    fn next(&self, reader: usize) -> Option<(usize, Work<D::Staging>)> {
        self.next_piece(reader)
    }

    fn run(&self, work: Work<D::Staging>) -> Result<u64, Failure> {
        let result = match work {
            Work::Failed(failure) => Err(failure),
            Work::Piece {
                reader,
                chunk,
                piece,
                staged,
            } => self.run_piece(reader, chunk, piece, &staged),
        };
        if result.is_err() {
            self.stop();
        }
        result
    }

    fn cancelled(&self, work: Work<D::Staging>) -> Failure {
        self.stop();
        match work {
            Work::Failed(failure) => failure,
            Work::Piece { .. } => stopped(),
        }
    }
}

/// The failure of a load whose cancel flags were set.
fn stopped() -> Failure {
    Failure {
        file: None,
        operation: Operation::Read,
        offset: None,
        error: cancel::stopped(),
        device: false,
    }
}

/// Fills `dst` (the piece's part of its chunk's buffer) with `piece`: from
/// the file's map (then letting go of the map's pages), straight from the
/// file, or read into `scratch` and placed from there. The bytes read (or
/// copied), and the values conversions overflowed; else what failed, at
/// which offset of the file.
fn fill(
    file: &DeviceFile<'_>,
    piece: &Piece,
    dst: &mut [u8],
    scratch: Option<&mut Vec<u8>>,
) -> Result<(u64, u64), (Operation, u64, io::Error)> {
    let read_len = piece.read.end - piece.read.start;
    let len = usize::try_from(read_len).map_err(|_| {
        let e = io::Error::from(io::ErrorKind::OutOfMemory);
        (Operation::Read, piece.read.start, e)
    })?;
    if let Some(map) = file.map {
        let start = usize::try_from(piece.read.start).unwrap_or(usize::MAX);
        let bytes = start
            .checked_add(len)
            .and_then(|end| map.bytes().get(start..end))
            .ok_or_else(|| {
                let e = io::Error::from(io::ErrorKind::UnexpectedEof);
                (Operation::Read, piece.read.start, e)
            })?;
        let overflowed = place(piece, bytes, dst)?;
        let_go(map, start, len);
        return Ok((read_len, overflowed));
    }
    if piece.straight() {
        let target = dst.get_mut(..len).ok_or_else(|| {
            let e = io::Error::other("a piece shorter than its read");
            (Operation::Read, piece.read.start, e)
        })?;
        file.source
            .read_at(target, len, piece.read.start)
            .map_err(|(at, e)| (Operation::Read, at, e))?;
        return Ok((read_len, 0));
    }
    let mut own = Vec::new();
    let scratch = scratch.unwrap_or(&mut own);
    scratch.resize(len, 0);
    let bytes = scratch.get_mut(..len).unwrap_or_default();
    file.source
        .read_at(bytes, len, piece.read.start)
        .map_err(|(at, e)| (Operation::Read, at, e))?;
    let overflowed = place(piece, bytes, dst)?;
    Ok((read_len, overflowed))
}

/// Places `piece`'s segments from `read` (the bytes of its read) into
/// `dst`, converting where a segment is converted.
fn place(piece: &Piece, read: &[u8], dst: &mut [u8]) -> Result<u64, (Operation, u64, io::Error)> {
    let mut overflowed = 0;
    for s in &piece.segments {
        let from = usize::try_from(s.src - piece.read.start).unwrap_or(usize::MAX);
        let at = s.dst - piece.dst.start;
        let (Some(src), Some(out)) = (
            from.checked_add(s.len).and_then(|end| read.get(from..end)),
            at.checked_add(s.out_len())
                .and_then(|end| dst.get_mut(at..end)),
        ) else {
            return Err((
                Operation::Convert,
                s.src,
                io::Error::other("a segment outside its piece"),
            ));
        };
        if s.raw() {
            out.copy_from_slice(src);
        } else {
            let converted = safeload_core::convert::convert(s.from, s.to, src, out)
                .map_err(|e| (Operation::Convert, s.src, io::Error::other(e.to_string())))?;
            overflowed += converted.overflowed();
        }
    }
    Ok(overflowed)
}
