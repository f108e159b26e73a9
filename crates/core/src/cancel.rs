//! Stopping a load early: the flags that cancel it, the scope that lets the read engine's queue see them, and the one error a cancelled load ends with.
//!
//! A load is cancelled by the caller's flag (`Loader::cancel_on`)
//! or, for an async load, by its future being dropped (`load/future.rs`). The flags are
//! checked where a load can stop cheaply: when it starts, between opening its files and
//! reading them, by every reader of the job queue before it takes its next job
//! (`jobs::run`), and every 20 ms by each remote request in flight, which is then dropped
//! (`remote/watch.rs`); a cache write publishes nothing once they are set. The threads a
//! load starts (`workers`) see its flags, and the one read loop (`jobs::drain`) checks them
//! before every piece, whatever its source (the load's reads, a prefetch's or a node
//! copy's chunks, the exchange's pieces). Hashing for `verify` runs to its end first.

use std::cell::RefCell;
use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, ErrorKind, Result};

/// The flags that cancel a load: set, any of them stops it.
#[derive(Clone, Debug, Default)]
pub struct Cancel {
    /// The caller's flag (`Loader::cancel_on`), which the crate only reads.
    by_caller: Option<Arc<AtomicBool>>,
    /// An async load's own flag, set when its future is dropped unfinished.
    by_drop: Option<Arc<AtomicBool>>,
}

impl Cancel {
    /// The same flags, the caller's being `flag`.
    pub fn with_caller(self, flag: Arc<AtomicBool>) -> Cancel {
        Cancel {
            by_caller: Some(flag),
            ..self
        }
    }

    /// The same flags, and `flag`, which an async load's future sets when it
    /// is dropped.
    pub(crate) fn with_drop(self, flag: Arc<AtomicBool>) -> Cancel {
        Cancel {
            by_drop: Some(flag),
            ..self
        }
    }

    /// Whether the load is to stop.
    pub fn is_set(&self) -> bool {
        [&self.by_caller, &self.by_drop]
            .into_iter()
            .flatten()
            .any(|flag| flag.load(Ordering::Relaxed))
    }
}

thread_local! {
    /// The flags of the load running on this thread, for the job queues it
    /// runs (see `scope`).
    static CURRENT: RefCell<Cancel> = RefCell::new(Cancel::default());
}

/// Runs `load`, the load of the checkpoint at `path`, with `cancel` as the
/// flags every job queue it runs on this thread checks ([`current`]). A load
/// whose flags are set when it starts, or that stops because they were set,
/// fails with [`ErrorKind::Cancelled`] naming `path`.
///
/// NOTE: the flags reach `jobs::run` through this thread-local scope rather
/// than as one more argument of every phase in between (`Run::finish`,
/// `queue::read_all`): those signatures stay the read engine's own, and
/// `jobs::run` reads the flags once, on the load's thread, before it starts
/// its readers. A queue run on another thread (none today) would not see them.
pub(crate) fn scope<T>(
    cancel: &Cancel,
    path: &Path,
    load: impl FnOnce() -> Result<T>,
) -> Result<T> {
    if cancel.is_set() {
        return Err(cancelled(path));
    }
    let outer = CURRENT.with(|current| current.replace(cancel.clone()));
    // Put back on the way out, a panic included.
    let _restore = Restore(Some(outer));
    load().map_err(|error| {
        // Set flags win over the error they caused (or raced with): the
        // caller asked the load to stop, and it did.
        if is_stopped(&error) || cancel.is_set() {
            cancelled(path)
        } else {
            error
        }
    })
}

/// Runs `f` with `cancel` as this thread's flags: a helper thread of a load
/// (`workers`) takes the load's, so that what it runs (a remote request
/// above all) stops when they are set.
pub(crate) fn within<T>(cancel: Cancel, f: impl FnOnce() -> T) -> T {
    let outer = CURRENT.with(|current| current.replace(cancel));
    let _restore = Restore(Some(outer));
    f()
}

/// Puts the outer scope's flags back when dropped.
struct Restore(Option<Cancel>);

impl Drop for Restore {
    fn drop(&mut self) {
        if let Some(outer) = self.0.take() {
            // `try_with`: the thread's locals may be gone when a thread ends.
            let _ = CURRENT.try_with(|current| current.replace(outer));
        }
    }
}

/// The flags of the load running on this thread (none outside `scope`).
pub fn current() -> Cancel {
    CURRENT
        .try_with(|current| current.borrow().clone())
        .unwrap_or_default()
}

/// The error of a load that stopped because it was cancelled.
pub(crate) fn cancelled(path: &Path) -> Error {
    Error::new(ErrorKind::Cancelled, path)
}

/// What a job queue that stopped for its flags hands up as its failure; the
/// phases above map it to a file's I/O error, and `scope` recognizes it.
pub fn stopped() -> io::Error {
    io::Error::other(Stopped)
}

/// Whether `error` is, or carries, the failure of [`stopped`].
fn is_stopped(error: &Error) -> bool {
    error
        .io_error()
        .and_then(io::Error::get_ref)
        .is_some_and(|inner| inner.is::<Stopped>())
}

/// The marker inside [`stopped`]'s error.
#[derive(Debug)]
struct Stopped;

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the load was cancelled")
    }
}

impl std::error::Error for Stopped {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Operation;

    fn flag(set: bool) -> Arc<AtomicBool> {
        Arc::new(AtomicBool::new(set))
    }

    #[test]
    fn any_flag_set_cancels() {
        assert!(!Cancel::default().is_set());
        let caller = Cancel::default().with_caller(flag(false));
        assert!(!caller.is_set());
        assert!(caller.clone().with_drop(flag(true)).is_set());
        assert!(Cancel::default().with_caller(flag(true)).is_set());
    }

    #[test]
    fn a_set_flag_fails_the_load_before_it_starts() {
        let cancel = Cancel::default().with_caller(flag(true));
        let mut ran = false;
        let err = scope(&cancel, Path::new("/m"), || {
            ran = true;
            Ok(())
        })
        .unwrap_err();
        assert!(!ran);
        assert_eq!(err.kind(), &ErrorKind::Cancelled);
        assert_eq!(err.path(), Some(Path::new("/m")));
        assert_eq!(err.to_string(), "/m: the load was cancelled");
    }

    #[test]
    fn the_scope_shows_its_flags_to_this_thread_only_and_restores_the_outer_ones() {
        let inner = flag(false);
        let cancel = Cancel::default().with_caller(Arc::clone(&inner));
        scope(&cancel, Path::new("/m"), || {
            inner.store(true, Ordering::Relaxed);
            assert!(current().is_set());
            let elsewhere = std::thread::spawn(|| current().is_set()).join().unwrap();
            assert!(!elsewhere);
            inner.store(false, Ordering::Relaxed);
            Ok(())
        })
        .unwrap();
        inner.store(true, Ordering::Relaxed);
        assert!(!current().is_set());
    }

    #[test]
    fn a_stopped_queue_is_cancelled_even_once_the_flag_is_reset() {
        let cancel = Cancel::default().with_caller(flag(false));
        let err = scope(&cancel, Path::new("/m"), || -> Result<()> {
            Err(Error::io(
                Operation::Read,
                "/m/a.safetensors",
                Some(8),
                stopped(),
            ))
        })
        .unwrap_err();
        assert_eq!(err.kind(), &ErrorKind::Cancelled);
        assert_eq!(err.path(), Some(Path::new("/m")));
    }

    #[test]
    fn other_errors_pass_through_while_no_flag_is_set() {
        let cancel = Cancel::default().with_caller(flag(false));
        let err = scope(&cancel, Path::new("/m"), || -> Result<()> {
            Err(Error::io(
                Operation::Open,
                "/m/a.safetensors",
                None,
                io::Error::from(io::ErrorKind::NotFound),
            ))
        })
        .unwrap_err();
        assert!(err.is_not_found());
        assert_eq!(err.path(), Some(Path::new("/m/a.safetensors")));
    }
}
