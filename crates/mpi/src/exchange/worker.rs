//! The exchange's MPI thread: it owns the communicators and the buffers that MPI reads and
//! writes, runs the collectives the exchange hands it, and answers each when it completes.
//!
//! MPI cannot cancel a collective, and its buffer must live until it completes: the caller
//! waits with a deadline, while this thread keeps the buffer and tests the request for as long
//! as the process lives. So a timeout never leaves MPI writing into the caller's memory.

use std::sync::mpsc::{Receiver, Sender};
use std::thread;
use std::time::{Duration, Instant};

use mpi::Count;
use mpi::datatype::PartitionMut;
use mpi::request::{Request, Scope};
use mpi::topology::{Rank, SimpleCommunicator};
use mpi::traits::*;

use super::MpiMembership;
use super::identity::NodeIdentity;
use super::init;
use super::setup::{index, split_by_node};
use safeload_core::cluster::{ExchangeError, ExchangeErrorKind};

/// A collective for the thread to run.
pub(super) enum Job {
    /// Every node's bytes, in node order.
    AllGather {
        mine: Vec<u8>,
        reply: Sender<Result<Vec<Vec<u8>>, ExchangeError>>,
    },
    /// `buf` sent from `root`, or overwritten with the root's; the buffer comes back in the
    /// reply, for the next job.
    Broadcast {
        root: Rank,
        buf: Vec<u8>,
        reply: Sender<Vec<u8>>,
    },
}

/// The thread's body: initialize MPI, split the world by node, say where this process stands
/// on `ready`, then, on the participant, run `jobs` until the exchange is dropped.
pub(super) fn run(
    identity: NodeIdentity,
    ready: Sender<Result<MpiMembership, ExchangeError>>,
    jobs: Receiver<Job>,
) {
    let (placement, participants) = match init::ensure().and_then(|()| split_by_node(identity)) {
        Ok((placement, participants)) => (Ok(placement), participants),
        Err(err) => (Err(err), None),
    };
    // The caller may have given up waiting: nothing to tell then.
    let _ = ready.send(placement);
    let Some(comm) = participants else {
        return;
    };
    while let Ok(job) = jobs.recv() {
        match job {
            Job::AllGather { mine, reply } => {
                let _ = reply.send(all_gather(&comm, &mine));
            }
            Job::Broadcast {
                root,
                mut buf,
                reply,
            } => {
                broadcast(&comm, root, &mut buf);
                let _ = reply.send(buf);
            }
        }
    }
    // Freeing a communicator after `MPI_Finalize` (an exit under way) is an MPI error.
    if !mpi::is_finalized() {
        init::call(|| drop(comm));
    }
}

fn broadcast(comm: &SimpleCommunicator, root: Rank, buf: &mut Vec<u8>) {
    mpi::request::scope(|scope| {
        complete(init::call(|| {
            comm.process_at_rank(root)
                .immediate_broadcast_into(scope, buf.as_mut_slice())
        }))
    });
}

/// Two collectives: every node's length, then the bytes (`MPI_Iallgatherv`); a total over
/// MPI's count is refused on every node alike.
fn all_gather(comm: &SimpleCommunicator, mine: &[u8]) -> Result<Vec<Vec<u8>>, ExchangeError> {
    let nodes = index(init::call(|| comm.size()));
    let len = u64::try_from(mine.len()).unwrap_or(u64::MAX);
    let mut lens = vec![0u64; nodes];
    mpi::request::scope(|scope| {
        complete(init::call(|| {
            comm.immediate_all_gather_into(scope, &len, &mut lens[..])
        }))
    });
    let total: u64 = lens.iter().sum();
    let too_large = || {
        ExchangeError::new(
            ExchangeErrorKind::Usage,
            format!(
                "all_gather of {total} bytes in all: more than MPI moves in one call ({} bytes)",
                Count::MAX
            ),
        )
    };
    let mut counts: Vec<Count> = Vec::with_capacity(nodes);
    let mut displs: Vec<Count> = Vec::with_capacity(nodes);
    let mut at: Count = 0;
    for &len in &lens {
        let count = Count::try_from(len).map_err(|_| too_large())?;
        counts.push(count);
        displs.push(at);
        at = at.checked_add(count).ok_or_else(too_large)?;
    }
    let mut all = vec![0u8; usize::try_from(total).map_err(|_| too_large())?];
    {
        let mut partition = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
        mpi::request::scope(|scope| {
            complete(init::call(|| {
                comm.immediate_all_gather_varcount_into(scope, mine, &mut partition)
            }))
        });
    }
    let each = displs.iter().zip(&counts).map(|(&at, &n)| {
        let (at, n) = (index(at), index(n));
        all.get(at..at + n)
            .map(<[u8]>::to_vec)
            .ok_or_else(too_large)
    });
    each.collect()
}

/// Tests `request` until it completes, pausing between tests; the deadline is the caller's.
pub(super) fn complete<'a, D: ?Sized, S: Scope<'a>>(mut request: Request<'a, D, S>) {
    let start = Instant::now();
    loop {
        match init::call(move || request.test()) {
            Ok(_) => return,
            Err(pending) => request = pending,
        }
        pause(start.elapsed());
    }
}

/// The pause before testing a pending collective again, after `waited`.
///
/// NOTE: MPI moves a non-blocking collective's bytes only inside MPI calls (Open MPI's `ob1`
/// has no progress thread): spin for the first milliseconds, then 100 µs so a late node costs
/// little CPU, then 10 ms past a second. Chosen, not measured on a fabric.
fn pause(waited: Duration) {
    if waited < Duration::from_millis(5) {
        thread::yield_now();
    } else if waited < Duration::from_secs(1) {
        thread::sleep(Duration::from_micros(100));
    } else {
        thread::sleep(Duration::from_millis(10));
    }
}
