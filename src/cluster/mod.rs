//! The exchange between nodes: a small trait for the collectives that move byte ranges from the
//! node that read them to every other node, and the checked broadcast built on it.
//!
//! Read once per cluster (issue 27) splits a checkpoint's reads among the nodes of a job; each
//! node then receives the other nodes' shares over the fabric. The movement is an engine's job,
//! not a protocol of ours: [`Exchange`] is what an engine implements with the communicator it
//! already has (NCCL, a ring, MPI), and `mpi.rs` (feature `mpi`) implements it on MPI.
//!
//! One participant per node takes part (the node copy's filler); the node's other local ranks
//! take the bytes from the node copy, not from the exchange.
//!
//! # Contract
//!
//! Every node calls the same collectives, in the same order, with the same `owner` and length:
//! a collective is matched by its place in that order, as in MPI. A node that stalls or dies
//! turns into an [`ExchangeError`] of kind [`ExchangeErrorKind::TimedOut`] on the others after
//! the deadline ([`TIMEOUT_ENV`]), never a hang; after that the exchange refuses every call.
//!
//! # Test seams
//!
//! `loopback.rs` (tests only) runs N nodes as threads of one process, so that code above the
//! trait is tested without MPI, and can corrupt what a node receives. Under MPI the lib tests
//! corrupt received ranges with `SAFELOAD_TEST_CORRUPT_EXCHANGE=<node>`, read only in test
//! builds (`mpi.rs`).

// Nothing above the trait calls it yet: the load is wired to it next (issue 27).
#![cfg_attr(not(test), allow(dead_code, unused_imports))]

mod checked;
mod error;
#[cfg(test)]
pub(crate) mod loopback;
#[cfg(feature = "mpi")]
pub(crate) mod mpi;

use std::time::Duration;

pub(crate) use checked::broadcast_checked;
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

/// The environment variable bounding every collective: seconds (a decimal number) a node
/// waits for the others before it gives up with [`ExchangeErrorKind::TimedOut`].
pub(crate) const TIMEOUT_ENV: &str = "SAFELOAD_EXCHANGE_TIMEOUT_SECS";

/// The bound on a collective where [`TIMEOUT_ENV`] is unset.
///
/// A collective waits for the slowest node to arrive, and a node arrives at a range's broadcast
/// only after reading its share up to it: the bound covers a read of a share's chunk from slow
/// storage, not only the transfer. A minute is far above that, and far below a job's patience.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The deadline of every collective: [`TIMEOUT_ENV`] from `var` (a lookup of the environment),
/// else [`DEFAULT_TIMEOUT`]. A value that is not a positive number of seconds is an error
/// naming the variable.
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
mod tests {
    use super::*;

    /// A lookup of the environment that sees only `pairs`.
    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
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
