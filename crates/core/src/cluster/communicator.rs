//! The public face of the exchange: [`Communicator`], what an engine implements with the
//! communicator it already has, and its adapter onto the crate's `Exchange`.

use std::io;
use std::sync::Arc;

use super::{Exchange, ExchangeError, ExchangeErrorKind};

/// The nodes of a job, as an engine's own communicator joins them, for a load whose nodes
/// read each byte once between them (`Loader::exchange`).
///
/// Give it to every process of the job: the node's local rank 0 is its participant and the
/// only one that calls it (the others call only [`nodes`](Self::nodes)); each node reads its
/// share of the buffered files and receives the rest through [`broadcast`](Self::broadcast),
/// each range checked against its reader's SHA-256 (a second broadcast of 32 bytes).
///
/// # Contract
///
/// - Every node makes the same calls, in the same order, with the same `owner` and length:
///   a call is matched by its place in that order, as a collective of MPI or NCCL is.
/// - No call waits forever: a node that stalls or dies makes the others' calls fail within
///   a bound of the implementation's choosing (an error of kind `TimedOut`), and every
///   later call fails too.
/// - Calls come from one thread at a time.
///
/// ```
/// use std::io;
/// use safeload::cluster::Communicator;
///
/// /// A job of one node: nothing to exchange (a load reads everything, as without it).
/// struct Alone;
///
/// impl Communicator for Alone {
///     fn node(&self) -> usize { 0 }
///     fn nodes(&self) -> usize { 1 }
///     fn all_gather(&self, mine: &[u8]) -> io::Result<Vec<Vec<u8>>> { Ok(vec![mine.to_vec()]) }
///     fn broadcast(&self, _owner: usize, _buf: &mut [u8]) -> io::Result<()> { Ok(()) }
/// }
///
/// # let dir = tempfile::tempdir()?;
/// # let data = vec![0u8; 64 * 32 * 2];
/// # let mut weight_map = std::collections::BTreeMap::new();
/// # for i in 0..2 {
/// #     let (name, file) = (format!("model.layers.{i}.mlp.up.weight"), format!("model-0000{}-of-00002.safetensors", i + 1));
/// #     let view = safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![64, 32], &data)?;
/// #     safetensors::serialize_to_file([(name.as_str(), view)], None, &dir.path().join(&file))?;
/// #     weight_map.insert(name, file);
/// # }
/// # let index = dir.path().join("model.safetensors.index.json");
/// # std::fs::write(&index, serde_json::json!({ "weight_map": weight_map }).to_string())?;
/// let sd = safeload::Loader::new().disable_mmap(true).exchange(Alone).load(&index)?;
/// assert!(sd.len() > 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Communicator: Send + Sync {
    /// This node's index, `0..nodes()`.
    fn node(&self) -> usize;

    /// The number of nodes in the job (one participant each).
    fn nodes(&self) -> usize;

    /// Every node gives `mine` (a few hundred bytes); each gets every node's, in node order.
    fn all_gather(&self, mine: &[u8]) -> io::Result<Vec<Vec<u8>>>;

    /// `buf` on node `owner` is copied into `buf` (of the same length) on every other node.
    fn broadcast(&self, owner: usize, buf: &mut [u8]) -> io::Result<()>;
}

/// An engine's [`Communicator`] as the crate's `Exchange`.
pub(crate) struct Engine(pub Arc<dyn Communicator>);

/// An engine's I/O error: a timeout stays one, anything else breaks the exchange.
fn from_io(what: &str, e: &io::Error) -> ExchangeError {
    let kind = match e.kind() {
        io::ErrorKind::TimedOut => ExchangeErrorKind::TimedOut,
        _ => ExchangeErrorKind::Broken,
    };
    ExchangeError::new(
        kind,
        format!("the engine's communicator failed in {what}: {e}"),
    )
}

impl Exchange for Engine {
    fn node(&self) -> usize {
        self.0.node()
    }

    fn nodes(&self) -> usize {
        self.0.nodes()
    }

    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, ExchangeError> {
        let all = self
            .0
            .all_gather(mine)
            .map_err(|e| from_io("an all-gather", &e))?;
        if all.len() != self.nodes() {
            return Err(ExchangeError::new(
                ExchangeErrorKind::Usage,
                format!(
                    "the engine's all-gather returned {} contributions for {} nodes",
                    all.len(),
                    self.nodes()
                ),
            ));
        }
        Ok(all)
    }

    fn broadcast(&self, owner: usize, buf: &mut [u8]) -> Result<(), ExchangeError> {
        self.0
            .broadcast(owner, buf)
            .map_err(|e| from_io("a broadcast", &e))
    }
}
