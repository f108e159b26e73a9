//! safeload's exchange between nodes on MPI: with `SAFELOAD_EXCHANGE=mpi`, the nodes of a job read each byte of a checkpoint once between them and broadcast the rest (the facade's feature `mpi`).
//!
//! The core splits a load's reads between the nodes and checks every range that arrives
//! (`safeload_core::cluster`); this crate is the transport under it, rsmpi over the system's
//! MPI, plugged in through the extras seam ([`MpiExtras`]). The `safeload` crate's feature
//! `mpi` builds it into its `Loader`'s extras; a job script sets `SAFELOAD_EXCHANGE=mpi`.

use std::io;

use safeload_core::cluster::Joined;
use safeload_core::extras::Extras;

#[cfg(feature = "mpi")]
mod exchange;
// Loads split between nodes under `mpirun`, through the exchange's harness.
#[cfg(all(test, unix, feature = "mpi"))]
mod load_tests;

/// The value of `SAFELOAD_EXCHANGE` this crate answers.
const NAME: &str = "mpi";

/// The exchange on MPI as a load's extras: `SAFELOAD_EXCHANGE=mpi` joins the job's MPI
/// exchange ([`Extras::join_exchange`]); every other value is left to other extras.
///
/// Joining is a collective over `MPI_COMM_WORLD`: every process of the job loads with it, in
/// the same order. It initializes MPI unless the engine did (and then finalizes it at exit);
/// nodes are told apart by `SAFELOAD_NODE_ID`, else `SLURM_NODEID`, else MPI's shared-memory
/// split, and the first process of each node takes part for it.
#[derive(Debug, Clone, Copy, Default)]
pub struct MpiExtras;

impl Extras for MpiExtras {
    fn join_exchange(&self, name: &str) -> Option<io::Result<Joined>> {
        (name == NAME).then(join)
    }
}

/// Joins the job's MPI exchange with the settings of the process's environment.
#[cfg(feature = "mpi")]
fn join() -> io::Result<Joined> {
    use safeload_core::cluster::Exchange;
    use std::sync::Arc;

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

/// Without the feature `mpi` there is no exchange to join: said, not skipped.
#[cfg(not(feature = "mpi"))]
fn join() -> io::Result<Joined> {
    Err(io::Error::other(
        "SAFELOAD_EXCHANGE=mpi needs safeload-mpi built with its feature `mpi`",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_mpi_is_answered() {
        assert!(MpiExtras.join_exchange("other").is_none());
        assert!(MpiExtras.join_exchange("MPI").is_none());
    }

    #[cfg(not(feature = "mpi"))]
    #[test]
    fn without_the_feature_mpi_is_refused_saying_which_feature() {
        let error = MpiExtras.join_exchange("mpi").unwrap().unwrap_err();
        assert!(error.to_string().contains("feature `mpi`"), "{error}");
    }
}
