//! The chunk queue as a source of the read loop (`jobs::drain`): a reader's next chunk is a free one, else one taken over from a holder that died or stopped, else one it waits for; each warmed or read into the sink by `Work::handle`.

use std::sync::Mutex;
use std::sync::atomic::Ordering;

use super::queue::FREE;
use super::takeover::Watch;
use super::worker::{Held, Work, swap};
use crate::error::{Error, Operation, Result};
use crate::jobs::JobSource;

/// One reader's place: its next free chunk's search start, and what it saw
/// of the holders it waits for (kept across waits).
pub(super) struct Reader {
    pub cursor: usize,
    pub watch: Watch,
}

/// The chunk queue as a source of the read loop.
pub(super) struct Claims<'w, 'a> {
    pub work: &'w Work<'a>,
    pub readers: Vec<Mutex<Reader>>,
}

thread_local! {
    /// A reader's scratch buffer and residency vector, reused across the
    /// chunks it handles.
    static BUFFERS: std::cell::RefCell<(Vec<u8>, Vec<u8>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

impl JobSource for Claims<'_, '_> {
    type Job = Held;
    type Error = Error;

    fn next(&self, reader: usize) -> Option<(usize, Held)> {
        let work = self.work;
        if work.tally.failed.load(Ordering::Relaxed) {
            return None;
        }
        let mut state = self.readers.get(reader)?.lock().ok()?;
        let Reader { cursor, watch } = &mut *state;
        let next = match work.claim_free(cursor) {
            Some(index) => Some(Held {
                index,
                claim: work.me.word(),
            }),
            None if work.shared => work.wait_or_take_over(watch),
            None => None,
        }?;
        work.beat();
        Some((next.index, next))
    }

    fn run(&self, held: Held) -> Result<u64> {
        let work = self.work;
        let handled = BUFFERS.with(|buffers| {
            let (scratch, pages) = &mut *buffers.borrow_mut();
            work.handle(held, scratch, pages)
        });
        match handled {
            Ok(()) => Ok(work.chunks.get(held.index).map_or(0, |c| c.len)),
            Err(e) => {
                // Let another rank try it.
                self.release(held);
                work.tally.failed.store(true, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    fn cancelled(&self, held: Held) -> Error {
        self.release(held);
        let path = self
            .work
            .chunks
            .get(held.index)
            .and_then(|c| self.work.targets.get(c.file))
            .map(|t| t.path.clone())
            .unwrap_or_default();
        Error::io(Operation::Prefetch, path, None, crate::cancel::stopped())
    }
}

impl Claims<'_, '_> {
    /// Gives the chunk back to the queue, for another rank to take.
    fn release(&self, held: Held) {
        if let Some(w) = self.work.states.get(held.index) {
            swap(w, held.claim, FREE);
        }
    }
}
