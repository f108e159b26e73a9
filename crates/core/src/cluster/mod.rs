//! Read once per cluster: the nodes of a job split a checkpoint's reads between them and
//! exchange the rest, through MPI (feature `mpi`, `SAFELOAD_EXCHANGE=mpi`) or the engine's own
//! communicator ([`Communicator`], given to `Loader::exchange`).
//!
//! Every node needs the whole checkpoint, so N nodes pull N times its bytes through the one
//! filesystem or store they share. With an exchange, the nodes first compare the files they
//! are about to load (names, lengths, versions, the plan of each buffer); each then reads its
//! share of the buffered files' 64 MiB pieces from storage, and every piece is broadcast from
//! the node that read it, with the SHA-256 it computed, checked by every receiver. Where the
//! nodes do not load the same files, or one cannot take part, each reads alone and the load's
//! notes say why. One process per node takes part (its local rank 0), and fills the node
//! copy (`node/`) its node's other local ranks wait for and map: each byte is read once per
//! cluster, however many processes each node runs.
//!
//! Under MPI the node is `SAFELOAD_NODE_ID`, else Slurm's `SLURM_NODEID`, else MPI's
//! shared-memory split; every collective is bounded by `SAFELOAD_EXCHANGE_TIMEOUT_SECS` (60 s
//! by default), so that a node that stalls is an error on the others, never a hang; a node
//! that dies ends the job (Open MPI kills the other processes).

// Inside: `Exchange`, the crate's trait for the collectives (an engine's `Communicator` is
// adapted onto it, `communicator.rs`; MPI implements it, `mpi/`), the checked broadcast
// built on it (`checked.rs`), and, for tests, `loopback.rs`, which runs N nodes as threads of
// one process and can corrupt what a node receives. Under MPI the lib tests corrupt received
// ranges with `SAFELOAD_TEST_CORRUPT_EXCHANGE=<node>`, read only in test builds.
//
// The contract of every implementation: the nodes make the same calls in the same order with
// the same owner and length (a collective is matched by its place in that order, as in MPI);
// a node that stalls or dies turns into an `ExchangeError` of kind `TimedOut` on the others
// after the deadline, never a hang, and the exchange then refuses every call.

mod checked;
mod communicator;
mod error;
#[cfg(test)]
pub(crate) mod loopback;
#[cfg(feature = "mpi")]
pub(crate) mod mpi;

use std::time::Duration;

pub(crate) use checked::broadcast_checked;
pub use communicator::Communicator;
pub(crate) use communicator::Engine;
pub(crate) use error::{ExchangeError, ExchangeErrorKind};

/// Collectives among the nodes of a job, one participant per node.
///
/// Implementations serialize concurrent calls (one collective at a time); the order of the
/// calls must be the same on every node, which only the caller can ensure.
pub(crate) trait Exchange: Send + Sync {
    /// This node's index, 0..nodes().
    fn node(&self) -> usize;

    /// The number of nodes (participants) in the job.
    fn nodes(&self) -> usize;

    /// Every node gives `mine`; each gets every node's, in node order. Used first, to agree on
    /// the files (name, size, version) before moving a byte.
    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, ExchangeError>;

    /// Every node calls with the same `owner` and `buf.len()`, in the same order: the owner's
    /// `buf` is sent, every other node's `buf` is overwritten with it.
    ///
    /// The bytes are not checked: [`broadcast_checked`] is the call for ranges of a file.
    fn broadcast(&self, owner: usize, buf: &mut [u8]) -> Result<(), ExchangeError>;
}

/// The environment variable that turns the exchange on for a load (`mpi`), for job scripts
/// and tests: the nodes of the job read each byte once between them.
pub(crate) const EXCHANGE_ENV: &str = "SAFELOAD_EXCHANGE";

/// This process's exchange, as the environment asks ([`EXCHANGE_ENV`]): `None` where it is
/// unset (or `0`/`none`), else the node's exchange (`None` on a process that is not its
/// node's participant) and the process's local rank and size among its node's processes.
///
/// # Errors
///
/// An exchange that cannot be joined (the timeout, a node identity that does not parse, MPI
/// missing), or a value this build does not know (`mpi` without the feature `mpi`), in words.
pub(crate) fn from_env() -> Result<Option<Joined>, String> {
    let Ok(value) = std::env::var(EXCHANGE_ENV) else {
        return Ok(None);
    };
    match value.trim() {
        "" | "0" | "none" | "off" => Ok(None),
        #[cfg(feature = "mpi")]
        "mpi" => {
            let settings = mpi::MpiSettings::from_env().map_err(|e| e.to_string())?;
            let joined = mpi::MpiExchange::join(&settings).map_err(|e| e.to_string())?;
            Ok(Some(Joined {
                exchange: joined
                    .exchange
                    .map(|e| std::sync::Arc::new(e) as std::sync::Arc<dyn Exchange>),
                local_rank: (joined.local_rank, joined.local_ranks),
                nodes: joined.nodes,
            }))
        }
        #[cfg(not(feature = "mpi"))]
        "mpi" => Err(format!(
            "{EXCHANGE_ENV}=mpi needs safeload built with the feature `mpi`"
        )),
        other => Err(format!(
            "{EXCHANGE_ENV}={other:?} is not a known exchange (mpi)"
        )),
    }
}

/// A process's part in a job's exchange.
pub(crate) struct Joined {
    /// The node's exchange, on its participant.
    pub exchange: Option<std::sync::Arc<dyn Exchange>>,
    /// This process's rank and the number of processes on its node.
    pub local_rank: (usize, usize),
    /// The number of nodes in the job.
    pub nodes: usize,
}

/// The environment variable bounding every collective: seconds (a decimal number) a node
/// waits for the others before it gives up with [`ExchangeErrorKind::TimedOut`].
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) const TIMEOUT_ENV: &str = "SAFELOAD_EXCHANGE_TIMEOUT_SECS";

/// The bound on a collective where [`TIMEOUT_ENV`] is unset.
///
/// A collective waits for the slowest node to arrive, and a node arrives at a range's broadcast
/// only after reading its share up to it: the bound covers a read of a share's chunk from slow
/// storage, not only the transfer. A minute is far above that, and far below a job's patience.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The deadline of every collective: [`TIMEOUT_ENV`] from `var` (a lookup of the environment),
/// else [`DEFAULT_TIMEOUT`]. A value that is not a positive number of seconds is an error
/// naming the variable.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn timeout_from(
    var: impl Fn(&str) -> Option<String>,
) -> Result<Duration, ExchangeError> {
    let Some(text) = var(TIMEOUT_ENV) else {
        return Ok(DEFAULT_TIMEOUT);
    };
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|secs| secs.is_finite() && *secs > 0.0)
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
        .ok_or_else(|| {
            ExchangeError::new(
                ExchangeErrorKind::Setup,
                format!("{TIMEOUT_ENV}={text:?} is not a positive number of seconds"),
            )
        })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A lookup of the environment that sees only `pairs`.
    pub(crate) fn vars<'a>(
        pairs: &'a [(&'a str, &'a str)],
    ) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_timeout_comes_from_the_environment_or_the_default() {
        assert_eq!(timeout_from(vars(&[])).unwrap(), DEFAULT_TIMEOUT);
        assert_eq!(
            timeout_from(vars(&[(TIMEOUT_ENV, "2")])).unwrap(),
            Duration::from_secs(2)
        );
        assert_eq!(
            timeout_from(vars(&[(TIMEOUT_ENV, " 0.25 ")])).unwrap(),
            Duration::from_millis(250)
        );
        for bad in ["0", "-1", "soon", "", "inf", "NaN"] {
            let err = timeout_from(vars(&[(TIMEOUT_ENV, bad)])).unwrap_err();
            assert_eq!(err.kind(), ExchangeErrorKind::Setup, "{bad:?}");
            assert!(err.to_string().contains(TIMEOUT_ENV), "{err}");
        }
    }
}
