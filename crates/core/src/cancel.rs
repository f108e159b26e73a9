//! Stopping a load early: the flags that cancel it, handed as a value to what checks them, and the one error a cancelled load ends with.
//!
//! A load is cancelled by the caller's flag (`Loader::cancel_on`) or, for an async load, by
//! its future being dropped. The flags travel from `Options::cancel` as an argument: the read
//! loop (`jobs::drain`) checks them before every piece, a remote request in flight every
//! 20 ms, a cache write before it publishes, and a load when it starts and before its reads.
//! Hashing for `verify` runs to its end first.

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

    /// No flags: nothing stops the work it is given to (a checkpoint's lazy
    /// reads, a prefetch launched on its own, the tests).
    pub const NONE: Cancel = Cancel {
        by_caller: None,
        by_drop: None,
    };
}

/// Runs `load`, the load of the checkpoint at `path` under `cancel`: one
/// whose flags are set when it starts, or that stops because they were set,
/// fails with [`ErrorKind::Cancelled`] naming `path`.
pub(crate) fn scope<T>(
    cancel: &Cancel,
    path: &Path,
    load: impl FnOnce() -> Result<T>,
) -> Result<T> {
    if cancel.is_set() {
        return Err(cancelled(path));
    }
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
