//! safeload's exchange between nodes on MPI: with `SAFELOAD_EXCHANGE=mpi`, the nodes of a job read each byte of a checkpoint once between them and broadcast the rest (the facade's feature `mpi`).
//!
//! The core splits a load's reads between the nodes and checks every range that arrives
//! (`safeload_core::cluster`); this crate is the transport under it: rsmpi over the
//! system's MPI library (Open MPI or MPICH), one participant per node, every collective bounded
//! by `SAFELOAD_EXCHANGE_TIMEOUT_SECS`. It plugs into a load through the core's extras seam:
//! [`MpiExtras`] joins the exchange when the environment names it.
//!
//! Engines do not name this crate: the `safeload` crate's feature `mpi` builds it into the
//! extras its `Loader` reads with (`safeload::extras::Builtin`), and a job script sets
//! `SAFELOAD_EXCHANGE=mpi` (README, "Many nodes").

use std::io;
use std::sync::Arc;

use safeload_core::cluster::{Exchange, Joined};
use safeload_core::extras::Extras;

// MPI's life in the process, node identity, the communicators and the collectives on a thread
// of their own (`exchange/`).
mod exchange;
// Loads split between nodes under `mpirun`, through the exchange's harness.
#[cfg(all(test, unix))]
mod load_tests;

/// The value of `SAFELOAD_EXCHANGE` this crate answers.
const NAME: &str = "mpi";

/// The exchange on MPI as a load's extras: `SAFELOAD_EXCHANGE=mpi` joins the job's MPI
/// exchange ([`Extras::join_exchange`]); every other value, and every address, is left to
/// other extras.
///
/// Joining is a collective over `MPI_COMM_WORLD`: every process of the job loads with it, in
/// the same order. It initializes MPI unless the engine did, and finalizes it at the process's
/// exit where it did; the nodes are told apart by `SAFELOAD_NODE_ID`, else Slurm's
/// `SLURM_NODEID`, else MPI's shared-memory split, and the first process of each node takes
/// part for it.
#[derive(Debug, Clone, Copy, Default)]
pub struct MpiExtras;

impl Extras for MpiExtras {
    fn join_exchange(&self, name: &str) -> Option<io::Result<Joined>> {
        (name == NAME).then(join)
    }
}

/// Joins the job's MPI exchange with the settings of the process's environment.
fn join() -> io::Result<Joined> {
    let settings = exchange::MpiSettings::from_env().map_err(io::Error::other)?;
    let membership = exchange::MpiExchange::join(&settings).map_err(io::Error::other)?;
    let exchange = membership
        .exchange
        .map(|e| Arc::new(e) as Arc<dyn Exchange>);
    Ok(Joined::new(
        exchange,
        (membership.local_rank, membership.local_ranks),
        membership.nodes,
    ))
}
