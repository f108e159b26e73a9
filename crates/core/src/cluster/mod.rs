//! Read once per cluster: the nodes of a job split a checkpoint's reads between them and
//! exchange the rest, through an exchange the load's extras join (`SAFELOAD_EXCHANGE=mpi`, the
//! facade's feature `mpi`) or the engine's own communicator ([`Communicator`], given to
//! `Loader::exchange`).
//!
//! Every node needs the whole checkpoint, so N nodes pull N times its bytes through the one
//! filesystem or store they share. With an exchange, the nodes first compare the files they
//! are about to load (names, lengths, versions, the plan of each buffer); each then reads its
//! share of the buffered files' 64 MiB pieces from storage, and every piece is broadcast from
//! the node that read it, with the SHA-256 it computed, checked by every receiver. Where the
//! nodes do not load the same files, or one cannot take part, each reads alone and the load's
//! notes say why. One process per node takes part (its local rank 0), and fills the node
//! copy (the node crate's) its node's other local ranks wait for and map: each byte is read once per
//! cluster, however many processes each node runs.
//!
//! Under `SAFELOAD_EXCHANGE=mpi` the node is `SAFELOAD_NODE_ID`, else Slurm's `SLURM_NODEID`,
//! else the job's shared-memory split; every collective is bounded by
//! `SAFELOAD_EXCHANGE_TIMEOUT_SECS` (60 s by default), so that a node that stalls is an error
//! on the others, never a hang; a node that dies ends the job (its launcher kills the other
//! processes).

// Inside: `Exchange`, the crate's trait for the collectives (an engine's `Communicator` is
// adapted onto it, `communicator.rs`; the plug-in crates implement it, and hand the load a
// `Joined` through `Extras::join_exchange`), the checked broadcast built on it (`checked.rs`),
// and, for tests, `loopback.rs`, which runs N nodes as threads of one process and can corrupt
// what a node receives.
//
// The contract of every implementation: the nodes make the same calls in the same order with
// the same owner and length (a collective is matched by its place in that order, as in MPI);
// a node that stalls or dies turns into an `ExchangeError` of kind `TimedOut` on the others
// after the deadline, never a hang, and the exchange then refuses every call.

mod checked;
mod communicator;
mod error;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

#[doc(hidden)] // for the plug-in crates
pub use checked::broadcast_checked;
pub use communicator::Communicator;
pub(crate) use communicator::Engine;
#[doc(hidden)] // for the plug-in crates
pub use error::{ExchangeError, ExchangeErrorKind};

/// Collectives among the nodes of a job, one participant per node.
///
/// Implementations serialize concurrent calls (one collective at a time); the order of the
/// calls must be the same on every node, which only the caller can ensure.
#[doc(hidden)] // for the plug-in crates
pub trait Exchange: Send + Sync {
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
/// unset (or `0`/`none`/`off`), else the exchange `join` (the load's extras,
/// `Extras::join_exchange`) joins for the value, trimmed.
///
/// # Errors
///
/// An exchange that cannot be joined (the timeout, a node identity that does not parse, the
/// system's library missing), or a value no extra of this build knows, in words.
pub(crate) fn from_env(
    join: impl FnOnce(&str) -> Option<std::io::Result<Joined>>,
) -> Result<Option<Joined>, String> {
    from_value(std::env::var(EXCHANGE_ENV).ok().as_deref(), join)
}

/// [`from_env`] with `value` for the variable's.
fn from_value(
    value: Option<&str>,
    join: impl FnOnce(&str) -> Option<std::io::Result<Joined>>,
) -> Result<Option<Joined>, String> {
    let Some(value) = value else {
        return Ok(None);
    };
    match value.trim() {
        "" | "0" | "none" | "off" => Ok(None),
        name => match join(name) {
            Some(joined) => joined.map(Some).map_err(|e| e.to_string()),
            None => Err(format!(
                "{EXCHANGE_ENV}={name:?} is not an exchange this build knows"
            )),
        },
    }
}

/// A process's part in its job's exchange between nodes, as the load's extras joined it for
/// `SAFELOAD_EXCHANGE` ([`Extras::join_exchange`](crate::extras::Extras::join_exchange)): the
/// node's exchange, on the process that takes part for its node, and the process's place
/// among its node's processes.
///
/// The plug-in crates make it (the facade's feature `mpi`); an engine with a communicator of
/// its own gives that to `Loader::exchange` instead.
pub struct Joined {
    /// The node's exchange, on its participant.
    pub(crate) exchange: Option<Arc<dyn Exchange>>,
    /// This process's rank and the number of processes on its node.
    pub(crate) local_rank: (usize, usize),
    /// The number of nodes in the job.
    pub(crate) nodes: usize,
}

impl Joined {
    /// A process's part: `exchange` on its node's participant (local rank 0) only,
    /// `local_rank` its rank and the number of processes on its node, `nodes` the job's.
    #[doc(hidden)] // for the plug-in crates
    pub fn new(
        exchange: Option<Arc<dyn Exchange>>,
        local_rank: (usize, usize),
        nodes: usize,
    ) -> Joined {
        Joined {
            exchange,
            local_rank,
            nodes,
        }
    }
}

impl fmt::Debug for Joined {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Joined")
            .field("participant", &self.exchange.is_some())
            .field("local_rank", &self.local_rank)
            .field("nodes", &self.nodes)
            .finish()
    }
}

/// The environment variable bounding every collective: seconds (a decimal number) a node
/// waits for the others before it gives up with [`ExchangeErrorKind::TimedOut`].
#[doc(hidden)] // for the plug-in crates
pub const TIMEOUT_ENV: &str = "SAFELOAD_EXCHANGE_TIMEOUT_SECS";

/// The bound on a collective where [`TIMEOUT_ENV`] is unset.
///
/// A collective waits for the slowest node to arrive, and a node arrives at a range's broadcast
/// only after reading its share up to it: the bound covers a read of a share's chunk from slow
/// storage, not only the transfer. A minute is far above that, and far below a job's patience.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The deadline of every collective: [`TIMEOUT_ENV`] from `var` (a lookup of the environment),
/// else [`DEFAULT_TIMEOUT`]. A value that is not a positive number of seconds is an error
/// naming the variable.
#[doc(hidden)] // for the plug-in crates
pub fn timeout_from(var: impl Fn(&str) -> Option<String>) -> Result<Duration, ExchangeError> {
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

    pub(crate) mod loopback;

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
    fn the_exchange_named_is_the_extras_and_a_name_they_do_not_know_is_refused() {
        let never =
            |name: &str| -> Option<std::io::Result<Joined>> { panic!("asked to join {name:?}") };
        for off in [
            None,
            Some(""),
            Some(" "),
            Some("0"),
            Some("none"),
            Some("off "),
        ] {
            assert!(from_value(off, never).unwrap().is_none(), "{off:?}");
        }
        // The extras get the value trimmed, and what they join is the load's.
        let mut asked = String::new();
        let joined = from_value(Some(" pigeons\n"), |name| {
            asked = name.to_string();
            Some(Ok(Joined::new(None, (1, 4), 3)))
        })
        .unwrap()
        .unwrap();
        assert_eq!(asked, "pigeons");
        assert!(joined.exchange.is_none());
        assert_eq!((joined.local_rank, joined.nodes), ((1, 4), 3));
        // Their error in their words; a name they do not know, named.
        let err = from_value(Some("pigeons"), |_| {
            Some(Err(std::io::Error::other("no pigeons today")))
        })
        .unwrap_err();
        assert_eq!(err, "no pigeons today");
        let err = from_value(Some("pigeons"), |_| None).unwrap_err();
        assert_eq!(
            err,
            "SAFELOAD_EXCHANGE=\"pigeons\" is not an exchange this build knows"
        );
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
