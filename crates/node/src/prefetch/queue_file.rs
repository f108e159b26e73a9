//! The shared queue file: created, validated, attached to or replaced under its lock, left (and removed by the last live rank) on drop; else a queue in this process's memory.
//!
//! The file is `safeload-prefetch-<hash>.queue` (`0600`, in `/dev/shm` unless
//! the caller says otherwise); the hash covers the files' identities, the
//! chunk size, the job and the format version. The first rank creates it and
//! fills it under the lock (`coord/lock.rs`), storing the magic last; the
//! others validate every word and replace a file that fails or that no live
//! rank is attached to. More than 256 ranks share the chunks, but only the
//! first 256 count for removing the file.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::plan::Init;
use super::queue::{
    HEADER_WORDS, Invalid, Layout, SHARED_SLOTS, TERMINAL, VERSION, at, heartbeat_words,
    init_words, live_attached, load, slot_words, validate,
};
use crate::coord::{self, Lock, Owner, Place};
use crate::os;
use crate::report::QueueNote;

/// A queue file mapped by this rank, left (and removed, by the last live
/// rank) on drop.
struct SharedQueue {
    /// The file's lock, let go of once joined, taken again to leave.
    lock: Lock,
    words: os::SharedWords,
    layout: Layout,
    slot: Option<usize>,
    replaced: Option<Invalid>,
}

impl SharedQueue {
    /// Creates the queue file, or attaches to a valid one, replacing one that
    /// is invalid or stale. `make` runs under the lock, only when creating.
    fn open(
        path: &Path,
        layout: &Layout,
        me: Owner,
        make: &mut dyn FnMut() -> Init,
    ) -> io::Result<SharedQueue> {
        let mut replaced = None;
        for _ in 0..8 {
            let lock = Lock::take(Place::Private(path), coord::PATIENCE).map_err(|e| {
                if e.kind() != io::ErrorKind::WouldBlock {
                    return e;
                }
                let why = format!(
                    "locked by another process of this user for {} s (a rank stopped while \
                     it joined or left the queue)",
                    coord::PATIENCE.as_secs()
                );
                io::Error::new(io::ErrorKind::WouldBlock, why)
            })?;
            let file = lock.file();
            let len = file.metadata()?.len();
            let (words, slot) = if len == 0 {
                file.set_len(layout.bytes())?;
                let words = os::SharedWords::map(file)?;
                init_words(words.words(), layout, &make(), Some(me));
                (words, Some(0))
            } else {
                match Self::check(file, len, layout)? {
                    Ok(words) => {
                        let slot = slot_words(words.words(), layout).iter().position(|w| {
                            w.compare_exchange(0, me.word(), Ordering::AcqRel, Ordering::Acquire)
                                .is_ok()
                        });
                        (words, slot)
                    }
                    Err(why) => {
                        replaced = Some(why);
                        lock.remove();
                        // Unlocked when `lock` drops; waiters see the name gone.
                        continue;
                    }
                }
            };
            lock.unlock();
            return Ok(SharedQueue {
                lock,
                words,
                layout: *layout,
                slot,
                replaced,
            });
        }
        Err(io::Error::other("the queue file kept being replaced"))
    }

    /// Maps a queue file of `len` bytes found under the lock, if it is a
    /// valid queue of this layout that a live rank is attached to.
    fn check(
        file: &File,
        len: u64,
        layout: &Layout,
    ) -> io::Result<std::result::Result<os::SharedWords, Invalid>> {
        if len != layout.bytes() {
            return Ok(Err(Invalid::Size));
        }
        let words = os::SharedWords::map(file)?;
        Ok(match validate(words.words(), layout) {
            Ok(()) if live_attached(words.words(), layout, &Owner::alive) == 0 => {
                Err(Invalid::Stale)
            }
            Ok(()) => Ok(words),
            Err(why) => Err(why),
        })
    }

    fn words(&self) -> &[AtomicU64] {
        self.words.words()
    }
}

impl Drop for SharedQueue {
    fn drop(&mut self) {
        if !matches!(self.lock.relock(coord::PATIENCE), Ok(true)) {
            return; // its holder stopped: the file is left to a later sweep
        }
        let words = self.words.words();
        if let Some(slot) = self
            .slot
            .and_then(|i| slot_words(words, &self.layout).get(i))
        {
            let word = slot.load(Ordering::Acquire);
            slot.store(word | TERMINAL, Ordering::Release);
        }
        if live_attached(words, &self.layout, &Owner::alive) == 0 {
            self.lock.remove();
        }
        self.lock.unlock();
    }
}

/// Whether a queue file, locked by the caller, is left by ranks all gone:
/// empty, never initialized, or valid with no live rank attached.
pub(crate) fn is_stale(file: &File) -> bool {
    let Ok(len) = file.metadata().map(|m| m.len()) else {
        return false;
    };
    if len == 0 {
        return true;
    }
    let Ok(words) = os::SharedWords::map(file) else {
        return false;
    };
    let w = words.words();
    let layout = Layout {
        key: load(w, at::KEY),
        chunk_size: load(w, at::CHUNK_SIZE),
        // From the length, so that a corrupt count cannot overflow.
        chunks: usize::try_from(len / 8)
            .unwrap_or(0)
            .saturating_sub(HEADER_WORDS + 2 * SHARED_SLOTS),
        total: load(w, at::TOTAL),
        slots: SHARED_SLOTS,
    };
    match validate(w, &layout) {
        Err(Invalid::Magic) => true,
        Ok(()) => live_attached(w, &layout, &Owner::alive) == 0,
        Err(_) => false,
    }
}

enum Store {
    Shared(SharedQueue),
    Local(Vec<AtomicU64>),
}

/// The queue a rank claims from, and what its report says about it.
pub(crate) struct Queue {
    store: Store,
    layout: Layout,
    /// The shared file, where there is one.
    pub path: Option<PathBuf>,
    /// Why the queue is not the shared file it could have been (where it
    /// could not be had, its path and the error), or which file it replaced.
    pub note: Option<QueueNote>,
}

impl Queue {
    /// A queue in this process's memory, with the same layout as a shared
    /// one; `make` decides its chunk states.
    pub(crate) fn local(
        layout: Layout,
        make: &mut dyn FnMut() -> Init,
        note: Option<QueueNote>,
    ) -> Queue {
        let words: Vec<AtomicU64> = (0..layout.words()).map(|_| AtomicU64::new(0)).collect();
        init_words(&words, &layout, &make(), None);
        Queue {
            store: Store::Local(words),
            layout,
            path: None,
            note,
        }
    }

    /// The queue file in `dir` for this key material, created, joined or
    /// replaced; a local queue where it cannot be had. `make` runs only if
    /// this rank creates the queue.
    pub(crate) fn shared(
        dir: &Path,
        key_material: &[u8],
        layout: Layout,
        me: Owner,
        make: &mut dyn FnMut() -> Init,
    ) -> Queue {
        let key_material = [key_material, &VERSION.to_le_bytes()].concat();
        let key_material = key_material.as_slice();
        let shared_layout = Layout {
            key: coord::fnv1a(0x6c62_272e_07bb_0142, key_material),
            slots: SHARED_SLOTS,
            ..layout
        };
        let name = format!(
            "safeload-prefetch-{:016x}.queue",
            coord::fnv1a(0xcbf2_9ce4_8422_2325, key_material)
        );
        let path = dir.join(name);
        match SharedQueue::open(&path, &shared_layout, me, make) {
            Ok(queue) => Queue {
                note: queue
                    .replaced
                    .map(|why| QueueNote::Replaced { why: why.as_str() }),
                store: Store::Shared(queue),
                layout: shared_layout,
                path: Some(path),
            },
            Err(e) => {
                let note = QueueNote::NotShared {
                    path,
                    why: e.to_string(),
                };
                Queue::local(layout, make, Some(note))
            }
        }
    }

    /// Whether other processes claim from the same words.
    pub(crate) fn is_shared(&self) -> bool {
        matches!(self.store, Store::Shared(_))
    }

    pub(crate) fn words(&self) -> &[AtomicU64] {
        match &self.store {
            Store::Shared(q) => q.words(),
            Store::Local(w) => w,
        }
    }

    pub(crate) fn layout(&self) -> &Layout {
        &self.layout
    }

    /// This rank's heartbeat, where it holds a slot of a shared queue.
    pub(super) fn heartbeat(&self) -> Option<&AtomicU64> {
        let Store::Shared(queue) = &self.store else {
            return None;
        };
        heartbeat_words(queue.words(), &self.layout).get(queue.slot?)
    }
}

// The shared queue file needs the Linux OS layer (a shared map, `flock(2)`, a private
// open); the stub has none, and prefetch splits the work statically there.
#[cfg(all(test, target_os = "linux", not(safeload_os_stub)))]
mod tests {
    use super::*;
    use crate::prefetch::plan::{guard, plan_chunks};
    use crate::prefetch::queue::{DONE, FREE, HEADER_WORDS, TAKEN_OVER, at, chunk_words, load};

    fn layout() -> Layout {
        Layout {
            key: 0x1234,
            chunk_size: 4096,
            chunks: 5,
            total: 20_000,
            slots: SHARED_SLOTS,
        }
    }

    fn fresh_init() -> Init {
        let chunks = plan_chunks(&[20_000], 4096);
        guard(&chunks, &[0, 4096, 0, 0, 0], None, true)
    }

    fn write_words(path: &Path, words: &[u64]) {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        std::fs::write(path, bytes).unwrap();
    }

    fn words_of(path: &Path) -> Vec<u64> {
        std::fs::read(path)
            .unwrap()
            .chunks(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// A queue file in a fresh directory, created by this process.
    fn created() -> (tempfile::TempDir, PathBuf, SharedQueue) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.queue");
        let queue = SharedQueue::open(&path, &layout(), Owner::current(), &mut fresh_init);
        (dir, path, queue.unwrap())
    }

    #[test]
    fn the_first_rank_creates_the_others_attach_the_last_removes() {
        let (_dir, path, first) = created();
        let me = Owner::current();
        assert_eq!(first.replaced, None);
        assert_eq!(first.slot, Some(0));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), layout().bytes());
        assert_eq!(validate(first.words(), &layout()), Ok(()));
        let states: Vec<u64> = chunk_words(first.words(), &layout())
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .collect();
        assert_eq!(states, vec![FREE, DONE, FREE, FREE, FREE]);

        let mut never = || -> Init { panic!("only the creator initializes") };
        let second = SharedQueue::open(&path, &layout(), me, &mut never).unwrap();
        assert_eq!(second.slot, Some(1));
        drop(first);
        assert!(path.exists(), "a live rank is still attached");
        drop(second);
        assert!(!path.exists(), "the last one removes it");
    }

    #[test]
    fn invalid_files_are_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.queue");
        let me = Owner::current();
        // A valid queue to corrupt, kept as words.
        let good = {
            let q = SharedQueue::open(&path, &layout(), me, &mut fresh_init).unwrap();
            let words = words_of(&path);
            drop(q);
            words
        };
        let corrupt = |f: &dyn Fn(&mut Vec<u64>)| {
            let mut w = good.clone();
            f(&mut w);
            w
        };
        let slot0 = HEADER_WORDS;
        let beat0 = HEADER_WORDS + SHARED_SLOTS;
        let chunk0 = HEADER_WORDS + 2 * SHARED_SLOTS;
        let dead = crate::dead_owner();
        let cases: Vec<(Vec<u64>, Invalid)> = vec![
            (good[..good.len() - 1].to_vec(), Invalid::Size),
            (vec![0; good.len()], Invalid::Magic),
            (corrupt(&|w| w[at::VERSION] = 99), Invalid::Version),
            (corrupt(&|w| w[at::KEY] ^= 1), Invalid::Layout),
            (corrupt(&|w| w[at::CHUNK_SIZE] = 8192), Invalid::Layout),
            (corrupt(&|w| w[at::VERSION] = 1), Invalid::Version),
            (corrupt(&|w| w[chunk0 + 2] = TERMINAL | 7), Invalid::Word),
            (
                corrupt(&|w| w[chunk0 + 2] = DONE | TAKEN_OVER),
                Invalid::Word,
            ),
            (corrupt(&|w| w[slot0] = 3 << 32), Invalid::Word),
            (corrupt(&|w| w[slot0] |= TAKEN_OVER), Invalid::Word),
            (corrupt(&|w| w[beat0 + 1] = 5), Invalid::Word),
            (corrupt(&|w| w[15] = 1), Invalid::Word),
            // Left by an earlier run whose ranks are gone, some chunks
            // still claimed by one of them.
            (
                corrupt(&|w| {
                    w[slot0] = dead.word();
                    w[chunk0] = dead.word();
                }),
                Invalid::Stale,
            ),
            (
                corrupt(&|w| w[slot0] = dead.word() | TERMINAL),
                Invalid::Stale,
            ),
        ];
        for (words, why) in cases {
            write_words(&path, &words);
            let q = SharedQueue::open(&path, &layout(), me, &mut fresh_init).unwrap();
            assert_eq!(q.replaced, Some(why));
            assert_eq!(validate(q.words(), &layout()), Ok(()));
            assert_eq!(load(q.words(), chunk0), FREE, "{why:?}: fresh states");
            drop(q);
        }
        // Another user's file, or a symlink, is never used.
        std::os::unix::fs::symlink("/dev/null", &path).unwrap();
        assert!(SharedQueue::open(&path, &layout(), me, &mut fresh_init).is_err());
    }

    #[test]
    fn the_sweep_removes_the_queues_of_dead_jobs_only() {
        let (dir, path, queue) = created();
        let named = |key: &str| dir.path().join(format!("safeload-prefetch-{key}.queue"));
        // The same queue, its one rank dead: left by a killed job.
        let mut words = words_of(&path);
        words[HEADER_WORDS] = crate::dead_owner().word();
        write_words(&named("dead"), &words);
        // Its one rank alive (this process): a live job's.
        std::fs::copy(&path, named("live")).unwrap();
        // Empty: its creator died before sizing it.
        std::fs::write(named("empty"), b"").unwrap();
        // Another format version: not this build's to judge.
        words[at::VERSION] = VERSION + 1;
        write_words(&named("other"), &words);
        assert_eq!(crate::copy::registry::sweep(dir.path()), 2);
        assert!(!named("dead").exists() && !named("empty").exists());
        assert!(named("live").exists() && named("other").exists());
        assert!(path.exists(), "not a queue file name: left alone");
        drop(queue);
    }

    #[test]
    fn a_live_queue_is_joined_not_replaced() {
        let (_dir, path, first) = created();
        let me = Owner::current();
        // Its chunks all done: a rank that arrives late joins and checks
        // residency itself.
        for w in chunk_words(first.words(), &layout()) {
            w.store(DONE, Ordering::Relaxed);
        }
        let late = SharedQueue::open(&path, &layout(), me, &mut fresh_init).unwrap();
        assert_eq!(late.replaced, None);
        assert_eq!(load(late.words(), HEADER_WORDS + 2 * SHARED_SLOTS), DONE);
    }
}
