//! From `MPI_COMM_WORLD` to one participant per node: the processes agree on how nodes are
//! identified, split into one communicator per node, and the first process of each node joins
//! the communicator of the participants, whose rank is the node's index.

use mpi::topology::{Color, Rank, SimpleCommunicator};
use mpi::traits::*;

use super::MpiMembership;
use super::identity::NodeIdentity;
use super::setup_error;
use super::{init, worker::complete};
use safeload_core::cluster::ExchangeError;

/// Splits `MPI_COMM_WORLD` by node (a collective over the world): where this process stands
/// (its exchange not yet made), and the participants' communicator on its node's participant.
///
/// MPI has no non-blocking split, so a non-blocking all-gather of the identities goes first:
/// once it completes every process has arrived, and the splits do not wait on an absent one.
pub(super) fn split_by_node(
    identity: NodeIdentity,
) -> Result<(MpiMembership, Option<SimpleCommunicator>), ExchangeError> {
    let world = SimpleCommunicator::world();
    let (rank, size) = init::call(|| (world.rank(), world.size()));

    let mine = identity.encode();
    let mut all: Vec<Rank> = vec![0; 2 * index(size)];
    mpi::request::scope(|scope| {
        complete(init::call(|| {
            world.immediate_all_gather_into(scope, &mine[..], &mut all[..])
        }))
    });
    let tags = all.chunks_exact(2).filter_map(|pair| pair.first().copied());
    if let Some((other, tag)) = tags.enumerate().find(|(_, tag)| *tag != mine[0]) {
        return Err(setup_error(format!(
            "the processes are not identified the same way: world rank {rank} by {}, world rank \
             {other} by {}; set {} in every process or in none",
            NodeIdentity::describe_tag(mine[0]),
            NodeIdentity::describe_tag(tag),
            super::identity::NODE_ID_ENV,
        )));
    }

    let (local, key) = match identity {
        NodeIdentity::SharedMemory => (init::call(|| world.split_shared(rank)), rank),
        NodeIdentity::Given { id, .. } => {
            let local = init::call(|| world.split_by_color_with_key(Color::with_value(id), rank));
            let local = local.ok_or_else(|| {
                setup_error(format!(
                    "MPI gave no communicator for the processes of node {id}"
                ))
            })?;
            // The nodes are indexed in the order of their numbers.
            (local, id)
        }
    };
    let (local_rank, local_ranks) = init::call(|| (local.rank(), local.size()));
    let color = if local_rank == 0 {
        Color::with_value(0)
    } else {
        Color::undefined()
    };
    let participants = init::call(|| world.split_by_color_with_key(color, key));

    // The participant tells its node's other processes the node's index and the count.
    let mut place: [Rank; 2] = match &participants {
        Some(comm) => init::call(|| [comm.rank(), comm.size()]),
        None => [0, 0],
    };
    mpi::request::scope(|scope| {
        complete(init::call(|| {
            local
                .process_at_rank(0)
                .immediate_broadcast_into(scope, &mut place[..])
        }))
    });
    init::call(|| drop(local));
    let [node, nodes] = place;
    Ok((
        MpiMembership {
            node: index(node),
            nodes: index(nodes),
            local_rank: index(local_rank),
            local_ranks: index(local_ranks),
            exchange: None,
        },
        participants,
    ))
}

/// A rank or a size as an index (MPI's are never negative).
pub(super) fn index(rank: Rank) -> usize {
    usize::try_from(rank).unwrap_or_default()
}
