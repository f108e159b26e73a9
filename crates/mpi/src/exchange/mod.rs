//! The exchange on MPI: rsmpi over the system's MPI, one participant per node, as the core's
//! `Exchange`.
//!
//! [`MpiExchange::join`] is a collective over `MPI_COMM_WORLD`, called by every process once
//! per exchange, in the same order: it initializes MPI unless the engine did (`init.rs`), tells
//! the nodes apart (`identity.rs`) and makes each node's local rank 0 its participant
//! (`setup.rs`); the other processes take the bytes from the node copy. Every collective runs
//! on the exchange's own thread (`worker.rs`); the caller waits at most the timeout
//! (`SAFELOAD_EXCHANGE_TIMEOUT_SECS`), then gets [`ExchangeErrorKind::TimedOut`], and every
//! later call [`ExchangeErrorKind::Broken`]. A broadcast goes in parts of [`CHUNK`] bytes,
//! each with the whole timeout: the bound is on a stall, not on a range's size.
//!
//! When a process dies, Open MPI's `mpirun` ends the job about a second later (the survivors
//! get no error to handle); one that exits 0 without `MPI_Finalize` counts the same, hence
//! `init.rs`. A stalled process ends nothing: the others time out here, and the first to exit
//! makes `mpirun` end the rest (BENCHMARKS.md, "crates/mpi/src/exchange/mod.rs: when a process
//! dies"; other launchers have their own rules, the timeout bounds the wait under any).
//!
//! In test builds, `SAFELOAD_TEST_CORRUPT_EXCHANGE=<node index>` makes that node flip the first
//! byte of every range it receives by broadcast, which the core's checked broadcast must catch.

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

/// The largest part of a range that one collective moves (MPI counts are C `int`s).
///
/// NOTE: 16 MiB keeps the thread's buffer small and a part long against the per-collective
/// latency. The copy through that buffer keeps a timed-out collective from writing into the
/// caller's memory (MPI cannot cancel one) without `unsafe`.
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
    /// The settings from the process's environment: the node's identity
    /// ([`NodeIdentity::from_vars`]) and the timeout ([`timeout_from`]).
    pub(crate) fn from_env() -> Result<Self, ExchangeError> {
        let var = |name: &str| std::env::var(name).ok();
        Ok(Self {
            identity: NodeIdentity::from_vars(var)?,
            timeout: timeout_from(var)?,
            #[cfg(test)]
            corrupt_node: var(CORRUPT_ENV).and_then(|v| v.trim().parse().ok()),
        })
    }
}

/// Where a process stands in an MPI job, and its exchange if it is its node's participant.
pub(crate) struct MpiMembership {
    /// The node's index, 0..nodes.
    pub(crate) node: usize,
    /// The number of nodes.
    pub(crate) nodes: usize,
    /// This process's rank among its node's processes (0 is the participant).
    pub(crate) local_rank: usize,
    /// The number of processes on this node.
    pub(crate) local_ranks: usize,
    /// The exchange, on the node's participant (local rank 0) only.
    pub(crate) exchange: Option<MpiExchange>,
}

/// [`Exchange`] on MPI, for the participant of a node. It does not check that the nodes'
/// calls agree: a mismatch is an MPI error or a wait that ends in the timeout.
pub(crate) struct MpiExchange {
    node: usize,
    nodes: usize,
    timeout: Duration,
    /// The way to the exchange's thread; the lock keeps two callers' parts apart.
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
    /// Joins the job's exchange (a collective over the world, bounded by `settings.timeout`):
    /// where this process stands, with the exchange on its node's participant.
    pub(crate) fn join(settings: &MpiSettings) -> Result<MpiMembership, ExchangeError> {
        let (ready_tx, ready) = mpsc::channel();
        let (jobs, jobs_rx) = mpsc::channel();
        let identity = settings.identity;
        thread::Builder::new()
            .name("safeload-mpi".into())
            .spawn(move || worker::run(identity, ready_tx, jobs_rx))
            .map_err(|e| setup_error(format!("cannot start the exchange's MPI thread: {e}")))?;
        let mut membership = wait(&ready, settings.timeout, || {
            format!(
                "joining the MPI exchange (identified by {identity}) did not complete within \
                 {:?}: not every process of the job joined",
                settings.timeout
            )
        })??;
        membership.exchange = (membership.local_rank == 0).then(|| MpiExchange {
            node: membership.node,
            nodes: membership.nodes,
            timeout: settings.timeout,
            calls: Mutex::new(Calls {
                jobs,
                spare: Vec::new(),
            }),
            broken: AtomicBool::new(false),
            #[cfg(test)]
            corrupt: settings.corrupt_node == Some(membership.node),
        });
        Ok(membership)
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

/// An error joining the exchange ([`ExchangeErrorKind::Setup`]).
fn setup_error(message: impl Into<String>) -> ExchangeError {
    ExchangeError::new(ExchangeErrorKind::Setup, message)
}

fn broken(why: &str) -> ExchangeError {
    ExchangeError::new(
        ExchangeErrorKind::Broken,
        format!("the MPI exchange cannot be used: {why}"),
    )
}
