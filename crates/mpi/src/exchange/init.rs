//! MPI's life in the process: initialized once, by the first exchange unless the engine did it
//! before, and finalized at the process's exit where this crate initialized it.
//!
//! Open MPI's `mpirun` counts a process that initialized MPI and exits without `MPI_Finalize`
//! as an abnormal termination: it prints "exiting improperly", kills the job's other processes
//! and exits with status 1 (measured with Open MPI 4.1.4, a rank returning 0 from `main` without
//! finalizing). A program that uses MPI only through safeload (the CLI under `mpirun`) never
//! finalizes of its own, so this file does it from an `atexit` handler. The handler stays away
//! where a collective timed out ([`mark_stalled`]): its request is still pending on the
//! exchange's thread, and `MPI_Finalize` would wait for the stalled node; the process then
//! exits without finalizing, which makes `mpirun` end the job, the stalled process included.

use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use mpi::environment::{Threading, Universe};

use safeload_core::cluster::{ExchangeError, ExchangeErrorKind};

/// The outcome of the one initialization: `Ok` once MPI is usable from the exchange's threads.
static INIT: OnceLock<Result<(), ExchangeError>> = OnceLock::new();

/// The universe where this crate initialized MPI: dropping it finalizes MPI.
static UNIVERSE: Mutex<Option<Universe>> = Mutex::new(None);

/// Set once a collective of this process timed out: MPI is not finalized at exit.
static STALLED: AtomicBool = AtomicBool::new(false);

/// Held around each MPI call of the exchanges' threads ([`call`]).
static CALLS: Mutex<()> = Mutex::new(());

// SAFETY: `atexit` is ISO C's, with this signature in every C library; it only stores the
// function pointer, whatever its argument, so calling it is safe.
// NOTE: declared here rather than taken from `libc`, which this crate does not otherwise need:
// `atexit` is in every C library, wherever rsmpi builds.
unsafe extern "C" {
    safe fn atexit(callback: extern "C" fn()) -> c_int;
}

/// MPI initialized (by this call, or earlier by the engine) with the thread support the
/// exchange needs, or why not. Only the first call does anything; the others return its
/// outcome.
///
/// The exchange calls MPI from threads of its own, one call at a time per exchange and with
/// several exchanges possibly at once: this crate asks for `MPI_THREAD_MULTIPLE`. Where the
/// engine initialized MPI first, its level must be at least `MPI_THREAD_SERIALIZED`, and then
/// the engine must not call MPI while an exchange does (the standard's rule for that level);
/// the exchanges' own calls are serialized by [`call`].
pub(super) fn ensure() -> Result<(), ExchangeError> {
    INIT.get_or_init(initialize).clone()
}

/// Runs `f`, one MPI call (a split, starting a collective, testing one), as the only MPI call
/// of the exchanges' threads in this process at the time: with `MPI_THREAD_SERIALIZED` (an
/// engine's choice) that is the standard's rule; with `MPI_THREAD_MULTIPLE` it costs an
/// uncontended lock per call.
pub(super) fn call<R>(f: impl FnOnce() -> R) -> R {
    let _only = CALLS.lock().unwrap_or_else(|p| p.into_inner());
    f()
}

/// Notes that a collective of this process timed out, so that MPI is not finalized at exit.
pub(super) fn mark_stalled() {
    STALLED.store(true, Ordering::SeqCst);
}

fn initialize() -> Result<(), ExchangeError> {
    let provided = match mpi::initialize_with_threading(Threading::Multiple) {
        Some((universe, provided)) => {
            *UNIVERSE.lock().unwrap_or_else(|p| p.into_inner()) = Some(universe);
            if atexit(finalize_at_exit) != 0 {
                return Err(setup_error(
                    "MPI was initialized, but its finalization at exit could not be registered",
                ));
            }
            provided
        }
        None if mpi::is_finalized() => {
            return Err(setup_error(
                "MPI was finalized before the exchange started (it cannot be initialized again)",
            ));
        }
        // Initialized by the engine: its level decides.
        None => mpi::environment::threading_support(),
    };
    if provided < Threading::Serialized {
        return Err(setup_error(format!(
            "MPI was initialized with thread support {provided:?}; the exchange calls MPI \
             from threads of its own and needs Serialized or Multiple"
        )));
    }
    Ok(())
}

fn setup_error(message: impl Into<String>) -> ExchangeError {
    ExchangeError::new(ExchangeErrorKind::Setup, message)
}

/// Finalizes MPI at the process's exit, unless a collective is still pending ([`STALLED`]).
extern "C" fn finalize_at_exit() {
    if STALLED.load(Ordering::SeqCst) {
        return;
    }
    let universe = UNIVERSE.lock().unwrap_or_else(|p| p.into_inner()).take();
    // Dropping the universe calls `MPI_Finalize`.
    drop(universe);
}
