//! Ranges moved with their digest: the owner's SHA-256 of a range travels with it, and every
//! receiver recomputes it, so that no corrupted range is used (as in vLLM #41749).

use sha2::{Digest, Sha256};

use super::{Exchange, ExchangeError, ExchangeErrorKind};
use crate::verify::{Digest256, hex};

/// [`Exchange::broadcast`] of `buf` from `owner`, then of the SHA-256 the owner computed; a
/// receiver whose bytes hash otherwise returns [`ExchangeErrorKind::Corrupt`]. Both broadcasts
/// happen on every node whatever the outcome, so the exchange stays usable after a `Corrupt`.
///
/// NOTE: the digest is a second collective of 32 bytes: appending it to the range would copy
/// the range on every node, which costs more than a collective's latency.
// Hidden on the item itself: the facade inlines `cluster`, where a `use`'s attribute does not
// reach.
#[doc(hidden)] // for the plug-in crates
pub fn broadcast_checked<E: Exchange + ?Sized>(
    ex: &E,
    owner: usize,
    buf: &mut [u8],
) -> Result<(), ExchangeError> {
    let nodes = ex.nodes();
    if owner >= nodes {
        return Err(ExchangeError::new(
            ExchangeErrorKind::Usage,
            format!("broadcast from node {owner}, but the job has {nodes} nodes"),
        ));
    }
    let mine = ex.node() == owner;
    let mut sent: Digest256 = if mine {
        Sha256::digest(&*buf).into()
    } else {
        [0; 32]
    };
    ex.broadcast(owner, buf)?;
    ex.broadcast(owner, &mut sent)?;
    if mine {
        return Ok(());
    }
    let received: Digest256 = Sha256::digest(&*buf).into();
    if received == sent {
        return Ok(());
    }
    Err(ExchangeError::new(
        ExchangeErrorKind::Corrupt,
        format!(
            "a range of {} bytes from node {owner} arrived corrupted on node {}: its SHA-256 is {}, \
             node {owner} sent {}",
            buf.len(),
            ex.node(),
            hex(&received),
            hex(&sent),
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    // The function as the rest of the crate sees it.
    use crate::cluster::broadcast_checked;
    use crate::cluster::tests::loopback::{Loopback, on_threads};

    /// `len` bytes that differ with `seed`, and from one position to the next.
    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn every_owner_moves_ranges_of_every_size_to_every_node() {
        let sizes = [0, 1, 4095, 3 << 20];
        let got = on_threads(Loopback::nodes(3), |ex| {
            let mut received = Vec::new();
            for owner in 0..ex.nodes() {
                for (i, &len) in sizes.iter().enumerate() {
                    let seed = (owner * 16 + i) as u8;
                    let mut buf = if ex.node() == owner {
                        pattern(len, seed)
                    } else {
                        vec![0; len]
                    };
                    broadcast_checked(ex, owner, &mut buf)?;
                    received.push(buf == pattern(len, seed));
                }
            }
            Ok(received)
        });
        for (node, result) in got.into_iter().enumerate() {
            let received = result.unwrap();
            assert_eq!(received.len(), 3 * sizes.len());
            assert!(received.iter().all(|&ok| ok), "node {node}: {received:?}");
        }
    }

    #[test]
    fn a_corrupted_range_is_an_error_on_the_receiver_that_got_it() {
        let nodes = Loopback::nodes(3)
            .into_iter()
            .map(|ex| if ex.node() == 2 { ex.corrupting() } else { ex })
            .collect();
        let got = on_threads(nodes, |ex| {
            let mut buf = if ex.node() == 0 {
                pattern(4096, 7)
            } else {
                vec![0; 4096]
            };
            broadcast_checked(ex, 0, &mut buf)
        });
        assert!(got[0].is_ok() && got[1].is_ok(), "{got:?}");
        let err = got[2].as_ref().unwrap_err();
        assert_eq!(err.kind(), ExchangeErrorKind::Corrupt);
        let text = err.to_string();
        assert!(
            text.starts_with("a range of 4096 bytes from node 0 arrived corrupted on node 2"),
            "{text}"
        );
    }

    #[test]
    fn the_exchange_stays_usable_after_a_corrupt_range() {
        let nodes = Loopback::nodes(2)
            .into_iter()
            .map(|ex| if ex.node() == 1 { ex.corrupting() } else { ex })
            .collect();
        let got = on_threads(nodes, |ex| {
            let mut first = if ex.node() == 0 {
                pattern(100, 1)
            } else {
                vec![0; 100]
            };
            let first = broadcast_checked(ex, 0, &mut first).map_err(|e| e.kind());
            let gathered = ex.all_gather(&[ex.node() as u8])?;
            Ok((first, gathered))
        });
        let (first, gathered) = got[1].clone().unwrap();
        assert_eq!(first, Err(ExchangeErrorKind::Corrupt));
        assert_eq!(gathered, vec![vec![0], vec![1]]);
    }

    #[test]
    fn an_owner_outside_the_job_is_refused_before_any_collective() {
        let ex = Loopback::nodes(1).pop().unwrap();
        let err = broadcast_checked(&ex, 1, &mut [0; 4]).unwrap_err();
        assert_eq!(err.kind(), ExchangeErrorKind::Usage);
        assert_eq!(
            err.to_string(),
            "broadcast from node 1, but the job has 1 nodes"
        );
    }
}
