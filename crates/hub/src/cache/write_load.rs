//! What a load tells a cache write besides the reads it sees (the `CacheWrite` seam): the file as the load's destination, reads paused for a node copy, an image written whole, the load's return.

use std::fs::File;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use super::checking::{Filling, Settle};
use super::{IMAGE_PIECE, Phase, Write};
use crate::source::{CacheUse, CacheWrite, NotCached};

impl CacheWrite for Write {
    fn map_destination(&self) -> Option<File> {
        let mut state = self.lock();
        if state.paused || !matches!(state.phase, Phase::Waiting { .. }) {
            return None;
        }
        let begun = self.begin(&mut state, true)?;
        match &mut state.phase {
            // Without reserved space a full disk would fault the map
            // (`SIGBUS`): such a file is written as it is read instead.
            Phase::Writing(progress) if begun.reserved => {
                progress.handed = true;
                begun.file.try_clone().ok()
            }
            _ => None,
        }
    }

    fn mapped_at(&self, addresses: Range<usize>) {
        let mut state = self.lock();
        if let Phase::Writing(progress) = &mut state.phase {
            if progress.handed && addresses.len() as u64 == self.len {
                progress.mapped = Some(addresses);
                progress.filling = Some(Filling::start());
            }
        }
    }

    fn pause(&self) {
        self.lock().paused = true;
    }

    fn resume(&self) {
        self.lock().paused = false;
    }

    fn write_image(&self, image: &[u8]) {
        if image.len() as u64 != self.len {
            self.abandon(NotCached::Partial {
                read: image.len() as u64,
                len: self.len,
            });
            return;
        }
        let mut at = 0usize;
        for piece in image.chunks(IMAGE_PIECE) {
            self.land_with(at as u64, piece, true);
            at += piece.len();
            if matches!(self.lock().phase, Phase::Done(_) | Phase::Checking(_)) {
                return;
            }
        }
        if image.is_empty() {
            // Nothing to land: the empty file is complete as it begins.
            let mut state = self.lock();
            if self.begin(&mut state, false).is_some() {
                self.advance(state);
            }
        }
    }

    fn abandon(&self, why: NotCached) {
        let mut state = self.lock();
        if !matches!(state.phase, Phase::Done(_) | Phase::Checking(_)) {
            state.phase = Phase::Done(Err(why));
        }
    }

    fn load_returned(&self) {
        self.returned.store(true, Ordering::Relaxed);
    }

    fn settled(&self) -> CacheUse {
        self.settle();
        self.outcome()
    }

    fn published_path(&self) -> Option<PathBuf> {
        let written = matches!(
            self.outcome(),
            CacheUse::Written { .. } | CacheUse::Checking { .. }
        );
        written.then(|| self.target.shown())
    }

    fn settle_on_drop(&self) -> Box<dyn Send + Sync> {
        self.deferred.store(true, Ordering::Relaxed);
        // `self` is always in an `Arc` (`Write::new`): its own is there to take.
        match self.me.upgrade() {
            Some(me) => Box::new(Settle(me)),
            None => Box::new(()),
        }
    }
}
