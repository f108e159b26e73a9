//! The exchange among threads of one process (tests only): N "nodes" meeting at each collective
//! through a shared table, so that code above [`Exchange`] is tested without MPI.
//!
//! It keeps MPI's rules where a test could trip on them: a collective completes only once every
//! node has called it, nodes whose calls at the same place differ (another collective, owner or
//! length) all get [`ExchangeErrorKind::Usage`], a node that never comes makes the others time
//! out (and the exchange refuses calls afterwards). A node made with [`Loopback::corrupting`]
//! flips the first byte of every non-empty range it receives, as a faulty wire would.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::cluster::{Exchange, ExchangeError, ExchangeErrorKind};

/// How long a loopback collective waits for the other threads unless told otherwise: long
/// enough for a loaded test machine, short enough that a test's mistake fails rather than hangs.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// One node of a loopback exchange.
pub(crate) struct Loopback {
    shared: Arc<Shared>,
    node: usize,
    /// The place of this node's next collective in its order; the lock also serializes calls.
    next: Mutex<u64>,
    timeout: Duration,
    corrupt: bool,
    broken: AtomicBool,
}

/// What the nodes of one loopback exchange share.
struct Shared {
    nodes: usize,
    rounds: Mutex<HashMap<u64, Round>>,
    changed: Condvar,
}

/// One collective, met by the nodes as they arrive.
struct Round {
    call: Call,
    /// The node whose call set `call`, for the message where another differs.
    first: usize,
    deposits: Vec<Option<Vec<u8>>>,
    arrived: usize,
    left: usize,
    mismatch: Option<String>,
}

/// A collective as a node called it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    AllGather,
    Broadcast { owner: usize, len: usize },
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Call::AllGather => write!(f, "all_gather"),
            Call::Broadcast { owner, len } => {
                write!(f, "broadcast of {len} bytes from node {owner}")
            }
        }
    }
}

impl Loopback {
    /// The `nodes` nodes of a new exchange, node `i` at index `i`, each to be moved to a thread
    /// of its own (see [`on_threads`]).
    pub(crate) fn nodes(nodes: usize) -> Vec<Loopback> {
        let shared = Arc::new(Shared {
            nodes,
            rounds: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
        });
        (0..nodes)
            .map(|node| Loopback {
                shared: Arc::clone(&shared),
                node,
                next: Mutex::new(0),
                timeout: DEFAULT_TIMEOUT,
                corrupt: false,
                broken: AtomicBool::new(false),
            })
            .collect()
    }

    /// This node, flipping the first byte of every non-empty range it receives.
    pub(crate) fn corrupting(mut self) -> Self {
        self.corrupt = true;
        self
    }

    /// This node, waiting at most `timeout` for the others at each collective.
    pub(crate) fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Meets the other nodes at this node's next collective: deposits `mine`, waits until every
    /// node has arrived, then returns what `take` makes of the deposits.
    fn meet<R>(
        &self,
        call: Call,
        mine: Option<Vec<u8>>,
        take: impl FnOnce(&[Option<Vec<u8>>]) -> R,
    ) -> Result<R, ExchangeError> {
        let mut next = self.next.lock().unwrap();
        if self.broken.load(Ordering::SeqCst) {
            return Err(ExchangeError::new(
                ExchangeErrorKind::Broken,
                "the exchange is broken by an earlier timeout",
            ));
        }
        let seq = *next;
        *next += 1;
        let shared = &*self.shared;
        let mut rounds = shared.rounds.lock().unwrap();
        let round = rounds.entry(seq).or_insert_with(|| Round {
            call,
            first: self.node,
            deposits: vec![None; shared.nodes],
            arrived: 0,
            left: 0,
            mismatch: None,
        });
        if round.call != call && round.mismatch.is_none() {
            round.mismatch = Some(format!(
                "node {} called {call} where node {} called {} (collective #{seq})",
                self.node, round.first, round.call
            ));
        }
        round.deposits[self.node] = mine;
        round.arrived += 1;
        shared.changed.notify_all();
        let start = Instant::now();
        let (mut rounds, waited) = shared
            .changed
            .wait_timeout_while(rounds, self.timeout, |rounds| {
                let round = &rounds[&seq];
                round.arrived < shared.nodes && round.mismatch.is_none()
            })
            .unwrap();
        let round = rounds.get_mut(&seq).unwrap();
        if let Some(mismatch) = &round.mismatch {
            return Err(ExchangeError::new(
                ExchangeErrorKind::Usage,
                mismatch.clone(),
            ));
        }
        if waited.timed_out() {
            self.broken.store(true, Ordering::SeqCst);
            return Err(ExchangeError::new(
                ExchangeErrorKind::TimedOut,
                format!(
                    "{call} on node {} did not complete within {:?}: {} of {} nodes arrived",
                    self.node,
                    start.elapsed(),
                    round.arrived,
                    shared.nodes
                ),
            ));
        }
        let taken = take(&round.deposits);
        round.left += 1;
        if round.left == shared.nodes {
            rounds.remove(&seq);
        }
        Ok(taken)
    }
}

impl Exchange for Loopback {
    fn node(&self) -> usize {
        self.node
    }

    fn nodes(&self) -> usize {
        self.shared.nodes
    }

    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, ExchangeError> {
        self.meet(Call::AllGather, Some(mine.to_vec()), |deposits| {
            deposits
                .iter()
                .map(|d| d.clone().unwrap_or_default())
                .collect()
        })
    }

    fn broadcast(&self, owner: usize, buf: &mut [u8]) -> Result<(), ExchangeError> {
        if owner >= self.shared.nodes {
            return Err(ExchangeError::new(
                ExchangeErrorKind::Usage,
                format!(
                    "broadcast from node {owner}, but the job has {} nodes",
                    self.shared.nodes
                ),
            ));
        }
        let call = Call::Broadcast {
            owner,
            len: buf.len(),
        };
        let mine = (owner == self.node).then(|| buf.to_vec());
        let sent = self.meet(call, mine, |deposits| deposits[owner].clone())?;
        if owner != self.node {
            buf.copy_from_slice(&sent.unwrap_or_default());
            if self.corrupt && !buf.is_empty() {
                buf[0] ^= 1;
            }
        }
        Ok(())
    }
}

/// Runs `body` for each node on a thread of its own, and returns each node's result in node
/// order.
pub(crate) fn on_threads<T: Send>(
    nodes: Vec<Loopback>,
    body: impl Fn(&Loopback) -> Result<T, ExchangeError> + Sync,
) -> Vec<Result<T, ExchangeError>> {
    std::thread::scope(|scope| {
        let body = &body;
        let threads: Vec<_> = nodes
            .into_iter()
            .map(|ex| scope.spawn(move || body(&ex)))
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_gather_returns_every_nodes_bytes_in_node_order() {
        let got = on_threads(Loopback::nodes(4), |ex| {
            let first = ex.all_gather(&vec![ex.node() as u8; ex.node()])?;
            let second = ex.all_gather(format!("node {}", ex.node()).as_bytes())?;
            Ok((first, second))
        });
        for result in got {
            let (first, second) = result.unwrap();
            assert_eq!(first, vec![vec![], vec![1], vec![2, 2], vec![3, 3, 3]]);
            let second: Vec<String> = second
                .into_iter()
                .map(|b| String::from_utf8(b).unwrap())
                .collect();
            assert_eq!(second, ["node 0", "node 1", "node 2", "node 3"]);
        }
    }

    #[test]
    fn calls_that_differ_across_nodes_are_an_error_on_every_node() {
        let got = on_threads(Loopback::nodes(3), |ex| {
            let len = if ex.node() == 2 { 5 } else { 4 };
            ex.broadcast(0, &mut vec![0; len])
        });
        for result in got {
            let err = result.unwrap_err();
            assert_eq!(err.kind(), ExchangeErrorKind::Usage);
            // Both calls named, in the order the nodes came (which node
            // came first is the threads' race).
            let text = err.to_string();
            assert!(
                text.contains("broadcast of 5 bytes from node 0")
                    && text.contains("broadcast of 4 bytes from node 0")
                    && text.contains(" where node "),
                "{err}"
            );
        }
    }

    #[test]
    fn a_node_that_never_comes_is_a_timeout_then_the_exchange_is_broken() {
        let nodes = Loopback::nodes(3)
            .into_iter()
            .map(|ex| ex.with_timeout(Duration::from_millis(200)))
            .collect();
        let got = on_threads(nodes, |ex| {
            if ex.node() == 1 {
                return Ok(None);
            }
            let start = Instant::now();
            let err = ex.broadcast(1, &mut [0; 8]).unwrap_err();
            assert!(start.elapsed() >= Duration::from_millis(200));
            let after = ex.all_gather(b"x").unwrap_err();
            Ok(Some((err, after.kind())))
        });
        for node in [0, 2] {
            let (err, after) = got[node].clone().unwrap().unwrap();
            assert_eq!(err.kind(), ExchangeErrorKind::TimedOut);
            let text = err.to_string();
            assert!(
                text.starts_with(&format!(
                    "broadcast of 8 bytes from node 1 on node {node} did not complete within"
                )),
                "{text}"
            );
            assert!(text.ends_with("2 of 3 nodes arrived"), "{text}");
            assert_eq!(after, ExchangeErrorKind::Broken);
        }
    }
}
