//! Read once per cluster: the nodes of a job split a checkpoint's reads between them and
//! exchange the rest, through an exchange the load's extras join (`SAFELOAD_EXCHANGE=mpi`, the
//! facade's feature `mpi`) or the engine's own communicator ([`Communicator`], given to
//! `Loader::exchange`).
//!
//! The nodes first compare the files they are about to load (names, lengths, versions, the
//! plan of each buffer); each then reads its share of the buffered files' 64 MiB pieces, and
//! every piece is broadcast from the node that read it with its SHA-256, checked by every
//! receiver. Where the nodes disagree or one cannot take part, each reads alone and the load's
//! notes say why. One process per node (its local rank 0) takes part and fills the node copy
//! its node's other ranks map: each byte is read once per cluster. Every collective is bounded
//! by `SAFELOAD_EXCHANGE_TIMEOUT_SECS` (60 s by default): a node that stalls is an error on the
//! others, never a hang.

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
/// # Contract
///
/// - Calls are serialized; the nodes make the same calls in the same order with the same owner
///   and length (a collective is matched by its place in that order, as in MPI).
/// - A node that stalls or dies is an [`ExchangeErrorKind::TimedOut`] on the others after the
///   deadline, never a hang, and every later call is refused.
#[doc(hidden)] // for the plug-in crates
pub trait Exchange: Send + Sync {
    /// This node's index, 0..nodes().
    fn node(&self) -> usize;

    /// The number of nodes (participants) in the job.
    fn nodes(&self) -> usize;

    /// Every node gives `mine`; each gets every node's, in node order.
    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, ExchangeError>;

    /// The owner's `buf` is copied into every other node's (unchecked: [`broadcast_checked`] is
    /// the call for ranges of a file).
    fn broadcast(&self, owner: usize, buf: &mut [u8]) -> Result<(), ExchangeError>;
}

/// The environment variable that names the exchange a load joins (`mpi`).
pub(crate) const EXCHANGE_ENV: &str = "SAFELOAD_EXCHANGE";

/// This process's exchange, as [`EXCHANGE_ENV`] asks: `None` where it is unset (or
/// `0`/`none`/`off`), else what `join` (`Extras::join_exchange`) joins for the value, trimmed;
/// an error in words where that fails or no extra knows the value.
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

/// A process's part in its job's exchange between nodes, as the load's extras joined it
/// ([`Extras::join_exchange`](crate::extras::Extras::join_exchange)).
pub struct Joined {
    pub(crate) exchange: Option<Arc<dyn Exchange>>,
    pub(crate) local_rank: (usize, usize),
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

/// The environment variable bounding every collective, in seconds.
#[doc(hidden)] // for the plug-in crates
pub const TIMEOUT_ENV: &str = "SAFELOAD_EXCHANGE_TIMEOUT_SECS";

/// The bound on a collective where [`TIMEOUT_ENV`] is unset: it covers a node's read of its
/// share's chunk from slow storage, not only the transfer, and is far below a job's patience.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The deadline of every collective: [`TIMEOUT_ENV`] from `var`, else [`DEFAULT_TIMEOUT`]; a
/// value that is not a positive number of seconds is an error naming the variable.
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
