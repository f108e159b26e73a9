//! The exchange on MPI: rsmpi over the system's MPI, one participant per node, as the core's
//! `Exchange`.
//!
//! # Joining
//!
//! [`MpiExchange::join`] is a collective over `MPI_COMM_WORLD`: every process of the job calls
//! it, once per exchange and in the same order. It initializes MPI unless the engine did
//! (`init.rs`), splits the world into one communicator per node and makes the first process of
//! each node (its local rank 0) the node's participant (`setup.rs`). Nodes are told apart by
//! `SAFELOAD_NODE_ID=<n>` (so that processes of one machine can stand in for nodes), else
//! Slurm's `SLURM_NODEID`, else MPI's shared-memory split (`identity.rs`). The other processes
//! of a node get its index and no exchange: they take the bytes from the node copy.
//!
//! # Bounded waits
//!
//! Every collective runs non-blocking on the exchange's own thread (`worker.rs`), which owns
//! the buffers MPI works on; the caller waits for it at most the timeout
//! (`SAFELOAD_EXCHANGE_TIMEOUT_SECS`, default 60 s), then returns
//! [`ExchangeErrorKind::TimedOut`] naming the collective and the time waited, and refuses every
//! later call ([`ExchangeErrorKind::Broken`]). A broadcast is cut into parts of [`CHUNK`]
//! bytes, each with the whole timeout: the bound is on a stall, not on a range's size.
//!
//! # When a process dies
//!
//! What Open MPI 4.1.4 does, measured on loopback with the tests of `tests.rs` (BENCHMARKS.md,
//! "crates/mpi/src/exchange/mod.rs: when a process dies"):
//!
//! - A process that dies (a signal, `abort`, a non-zero exit) ends the job: `mpirun` notices,
//!   prints which rank died and how ("exited on signal 9 (Killed)"), and kills the other
//!   processes, waiting in a collective or not; `mpirun` exits non-zero. The survivors get no
//!   error to handle: `mpirun` had ended 1.0-1.2 s after the death (SIGKILL or `abort`).
//! - A process that exits with status 0 without `MPI_Finalize` is taken the same way ("exiting
//!   improperly"): this is why `init.rs` finalizes at exit.
//! - A process that stalls (alive, never calling) ends nothing by itself: the others' collectives
//!   wait. Here they end with [`ExchangeErrorKind::TimedOut`] after the timeout; when the first
//!   of them exits (non-zero, or zero without finalizing, which `init.rs` skips after a timeout),
//!   `mpirun` kills the rest, the stalled process included (with a timeout of 2 s, `mpirun` had
//!   ended 2.5 s after it started).
//!
//! Launchers other than `mpirun` (Slurm's `srun`, Hydra) have their own rules (`srun
//! --kill-on-bad-exit`); the timeout bounds the wait under any of them.
//!
//! # Test seam
//!
//! In test builds, `SAFELOAD_TEST_CORRUPT_EXCHANGE=<node index>` makes that node flip the first
//! byte of every non-empty range it receives by broadcast, after the transfer, as a faulty wire
//! would: the core's checked broadcast (`safeload_core::cluster::broadcast_checked`) must catch it.

mod identity;
mod init;
mod setup;
// `mpirun` jobs, killed by process group where they overrun.
#[cfg(all(test, unix))]
pub(crate) mod tests;
mod worker;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

use mpi::topology::Rank;

pub(crate) use identity::NodeIdentity;
#[cfg(test)]
pub(crate) use identity::{NODE_ID_ENV, SLURM_NODE_ID_ENV};

use safeload_core::cluster::{Exchange, ExchangeError, ExchangeErrorKind, timeout_from};
use worker::Job;

/// The largest part of a range that one collective moves.
///
/// MPI counts are C `int`s (2 GiB - 1 bytes at most), and the range passes through a buffer of
/// the exchange's thread (`worker.rs`), reused from part to part: 16 MiB keeps that buffer
/// small and a part's transfer long against the per-collective latency.
///
/// NOTE: the copy into and out of that buffer costs a memory copy per byte on each side; it is
/// what keeps a timed-out collective from writing into the caller's memory without `unsafe`
/// (MPI cannot cancel a collective). Overlapping a part's copy with the next one's transfer
/// (two buffers) is left for when a fabric shows the copy in a profile.
pub(crate) const CHUNK: usize = 16 << 20;

/// The test seam's variable: see the module's docs.
#[cfg(test)]
pub(crate) const CORRUPT_ENV: &str = "SAFELOAD_TEST_CORRUPT_EXCHANGE";

/// How a process joins an MPI exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MpiSettings {
    /// Which node this process is on.
    pub(crate) identity: NodeIdentity,
    /// The bound on each collective.
    pub(crate) timeout: Duration,
    /// The node that corrupts what it receives (test builds only).
    #[cfg(test)]
    pub(crate) corrupt_node: Option<usize>,
}

impl MpiSettings {
    /// The settings from the process's environment ([`MpiSettings::from_vars`]).
    pub(crate) fn from_env() -> Result<Self, ExchangeError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// The settings from `var`, a lookup of the environment: the node's identity
    /// ([`NodeIdentity::from_vars`]) and the timeout ([`timeout_from`]).
    pub(crate) fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, ExchangeError> {
        Ok(Self {
            identity: NodeIdentity::from_vars(&var)?,
            timeout: timeout_from(&var)?,
            #[cfg(test)]
            corrupt_node: var(CORRUPT_ENV).and_then(|v| v.trim().parse().ok()),
        })
    }
}

/// Where a process stands in an MPI job, and its exchange if it is its node's participant.
pub(crate) struct MpiMembership {
    /// The node's index, 0..nodes (the order of `SAFELOAD_NODE_ID` or `SLURM_NODEID` numbers,
    /// else of the nodes' first world ranks). The load takes it from the exchange, on the
    /// participant; the tests read it on every process.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) node: usize,
    /// The number of nodes.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) nodes: usize,
    /// This process's rank among its node's processes.
    pub(crate) local_rank: usize,
    /// The number of processes on this node.
    pub(crate) local_ranks: usize,
    /// The exchange, on the node's participant (local rank 0) only.
    pub(crate) exchange: Option<MpiExchange>,
}

/// [`Exchange`] on MPI, for the participant of a node (see the module's docs).
///
/// Unlike the loopback, it does not check that the nodes' calls agree (owner, length): MPI
/// does not either, and a mismatch is an MPI error (Open MPI's default handler aborts the job)
/// or a wait that ends in the timeout.
pub(crate) struct MpiExchange {
    node: usize,
    nodes: usize,
    timeout: Duration,
    /// The way to the exchange's thread; the lock makes each collective whole (no two callers'
    /// parts interleaved).
    calls: Mutex<Calls>,
    /// Set by a timeout or a lost thread: every later call is refused.
    broken: AtomicBool,
    #[cfg(test)]
    corrupt: bool,
}

/// What a collective needs of the exchange's thread.
struct Calls {
    jobs: mpsc::Sender<Job>,
    /// The buffer of the last broadcast, back from the thread, for the next one.
    spare: Vec<u8>,
}

impl MpiExchange {
    /// Joins the job's exchange (a collective over the world: see the module's docs): where
    /// this process stands, with the exchange on its node's participant. The wait for the
    /// other processes is bounded by `settings.timeout`, as every collective's.
    pub(crate) fn join(settings: &MpiSettings) -> Result<MpiMembership, ExchangeError> {
        let (ready_tx, ready) = mpsc::channel();
        let (jobs, jobs_rx) = mpsc::channel();
        let identity = settings.identity;
        thread::Builder::new()
            .name("safeload-mpi".into())
            .spawn(move || worker::run(identity, ready_tx, jobs_rx))
            .map_err(|e| {
                ExchangeError::new(
                    ExchangeErrorKind::Setup,
                    format!("cannot start the exchange's MPI thread: {e}"),
                )
            })?;
        let placement = wait(&ready, settings.timeout, || {
            format!(
                "joining the MPI exchange (identified by {identity}) did not complete within \
                 {:?}: not every process of the job joined",
                settings.timeout
            )
        })??;
        let exchange = (placement.local_rank == 0).then(|| MpiExchange {
            node: placement.node,
            nodes: placement.nodes,
            timeout: settings.timeout,
            calls: Mutex::new(Calls {
                jobs,
                spare: Vec::new(),
            }),
            broken: AtomicBool::new(false),
            #[cfg(test)]
            corrupt: settings.corrupt_node == Some(placement.node),
        });
        Ok(MpiMembership {
            node: placement.node,
            nodes: placement.nodes,
            local_rank: placement.local_rank,
            local_ranks: placement.local_ranks,
            exchange,
        })
    }

    /// The way to the thread, for one collective; refused once the exchange is broken.
    fn calls(&self) -> Result<MutexGuard<'_, Calls>, ExchangeError> {
        let calls = self.calls.lock().map_err(|_| broken("a caller panicked"))?;
        if self.broken.load(Ordering::SeqCst) {
            return Err(broken("an earlier collective failed"));
        }
        Ok(calls)
    }

    /// [`wait`] for the thread's reply; a timeout or a lost thread breaks the exchange.
    fn reply<T>(
        &self,
        reply: &Receiver<T>,
        timed_out: impl FnOnce() -> String,
    ) -> Result<T, ExchangeError> {
        wait(reply, self.timeout, timed_out).inspect_err(|_| {
            self.broken.store(true, Ordering::SeqCst);
        })
    }

    /// Sends `job` to the thread; a thread that is gone breaks the exchange.
    fn send(&self, calls: &Calls, job: Job) -> Result<(), ExchangeError> {
        calls.jobs.send(job).map_err(|_| {
            self.broken.store(true, Ordering::SeqCst);
            broken("the exchange's MPI thread has ended")
        })
    }
}

impl Exchange for MpiExchange {
    fn node(&self) -> usize {
        self.node
    }

    fn nodes(&self) -> usize {
        self.nodes
    }

    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, ExchangeError> {
        let calls = self.calls()?;
        let (reply, replies) = mpsc::channel();
        let mine = mine.to_vec();
        self.send(&calls, Job::AllGather { mine, reply })?;
        self.reply(&replies, || {
            format!(
                "all_gather among {} nodes did not complete within {:?} on node {} (a node \
                 stalled or died)",
                self.nodes, self.timeout, self.node
            )
        })?
    }

    fn broadcast(&self, owner: usize, buf: &mut [u8]) -> Result<(), ExchangeError> {
        let usage = |what: String| ExchangeError::new(ExchangeErrorKind::Usage, what);
        if owner >= self.nodes {
            return Err(usage(format!(
                "broadcast from node {owner}, but the job has {} nodes",
                self.nodes
            )));
        }
        let root = Rank::try_from(owner).map_err(|_| usage(format!("node {owner}")))?;
        let mut calls = self.calls()?;
        let sending = owner == self.node;
        let len = buf.len();
        let mut start = 0;
        for part in buf.chunks_mut(CHUNK) {
            let mut staging = std::mem::take(&mut calls.spare);
            if sending {
                staging.clear();
                staging.extend_from_slice(part);
            } else {
                // Only a longer buffer than the last is zero-filled; MPI overwrites it all.
                staging.resize(part.len(), 0);
            }
            let (reply, replies) = mpsc::channel();
            self.send(
                &calls,
                Job::Broadcast {
                    root,
                    buf: staging,
                    reply,
                },
            )?;
            let end = start + part.len();
            let staging = self.reply(&replies, || {
                format!(
                    "broadcast of {len} bytes from node {owner} did not complete within {:?} on \
                     node {} (at bytes {start}..{end}; a node stalled or died)",
                    self.timeout, self.node
                )
            })?;
            if !sending {
                part.copy_from_slice(&staging);
            }
            calls.spare = staging;
            start = end;
        }
        #[cfg(test)]
        if self.corrupt && !sending {
            if let Some(first) = buf.first_mut() {
                *first ^= 1;
            }
        }
        Ok(())
    }
}

/// The reply on `reply` within `timeout`; else [`ExchangeErrorKind::TimedOut`] saying
/// `timed_out()`, and MPI left unfinalized at exit (`init.rs`).
fn wait<T>(
    reply: &Receiver<T>,
    timeout: Duration,
    timed_out: impl FnOnce() -> String,
) -> Result<T, ExchangeError> {
    reply.recv_timeout(timeout).map_err(|e| match e {
        RecvTimeoutError::Timeout => {
            init::mark_stalled();
            ExchangeError::new(ExchangeErrorKind::TimedOut, timed_out())
        }
        RecvTimeoutError::Disconnected => broken("the exchange's MPI thread has ended"),
    })
}

fn broken(why: &str) -> ExchangeError {
    ExchangeError::new(
        ExchangeErrorKind::Broken,
        format!("the MPI exchange cannot be used: {why}"),
    )
}
