//! MPI's life in the process: initialized once, by the first exchange unless the engine did it
//! before, and finalized at the process's exit where this crate initialized it.
//!
//! `mpirun` takes a process that exits without `MPI_Finalize` for a failure and kills the job
//! (Open MPI 4.1.4), and the CLI never finalizes of its own: an `atexit` handler does it. Not
//! after a timeout ([`mark_stalled`]): `MPI_Finalize` would wait for the stalled node; exiting
//! unfinalized makes `mpirun` end the job, the stalled process included.

use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use mpi::environment::{Threading, Universe};

use super::setup_error;
use safeload_core::cluster::ExchangeError;

/// The outcome of the one initialization: `Ok` once MPI is usable from the exchange's threads.
static INIT: OnceLock<Result<(), ExchangeError>> = OnceLock::new();

/// The universe where this crate initialized MPI: dropping it finalizes MPI.
static UNIVERSE: Mutex<Option<Universe>> = Mutex::new(None);

/// Set once a collective of this process timed out: MPI is not finalized at exit.
static STALLED: AtomicBool = AtomicBool::new(false);

/// Held around each MPI call of the exchanges' threads ([`call`]).
static CALLS: Mutex<()> = Mutex::new(());

// SAFETY: `atexit` is ISO C's, with this signature in every C library; it only stores the
// function pointer, so calling it is safe. Declared here: the crate needs nothing else of `libc`.
unsafe extern "C" {
    safe fn atexit(callback: extern "C" fn()) -> c_int;
}

/// MPI initialized (by the first call, or earlier by the engine) with the thread support the
/// exchange needs, or why not. This crate asks for `MPI_THREAD_MULTIPLE`; an engine's own
/// initialization must give at least `MPI_THREAD_SERIALIZED` (then the engine must not call
/// MPI while an exchange does; the exchanges' calls are serialized by [`call`]).
pub(super) fn ensure() -> Result<(), ExchangeError> {
    INIT.get_or_init(initialize).clone()
}

/// Runs `f`, one MPI call, as the only one of the exchanges' threads at the time (the rule of
/// `MPI_THREAD_SERIALIZED`; an uncontended lock under `MPI_THREAD_MULTIPLE`).
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

/// Finalizes MPI at the process's exit, unless a collective is still pending ([`STALLED`]).
extern "C" fn finalize_at_exit() {
    if STALLED.load(Ordering::SeqCst) {
        return;
    }
    let universe = UNIVERSE.lock().unwrap_or_else(|p| p.into_inner()).take();
    // Dropping the universe calls `MPI_Finalize`.
    drop(universe);
}
