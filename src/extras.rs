//! What this build reads beyond local paths: the extras its cargo features
//! compile in, which [`Loader`](crate::Loader) and [`Checkpoint`](crate::Checkpoint)
//! resolve addresses with (and join the exchange between nodes
//! `SAFELOAD_EXCHANGE` names through); and, in every build, the copy per
//! node the local ranks of a job share and the page-cache warm-up.

pub use safeload_core::extras::{Extras, NoExtras};
use safeload_node::NodeExtras;

/// The extras of this build: the node copy and the page-cache warm-up
/// (always); with the feature `remote`, the object stores and the Hugging
/// Face hub, through their caches; with the feature `mpi`, the exchange
/// between nodes that `SAFELOAD_EXCHANGE=mpi` joins.
#[derive(Debug, Clone, Copy, Default)]
pub struct Builtin;

impl Extras for Builtin {
    fn resolve(
        &self,
        address: &str,
        caching: safeload_core::extras::Caching<'_>,
    ) -> Option<safeload_core::Result<safeload_core::extras::Resolution>> {
        #[cfg(feature = "remote")]
        return safeload_hub::RemoteExtras.resolve(address, caching);
        #[cfg(not(feature = "remote"))]
        {
            let _ = (address, caching);
            None
        }
    }

    fn join_exchange(&self, name: &str) -> Option<std::io::Result<safeload_core::cluster::Joined>> {
        #[cfg(feature = "mpi")]
        return safeload_mpi::MpiExtras.join_exchange(name);
        // Without the feature the value is still this build's to refuse, saying what
        // would take it.
        #[cfg(not(feature = "mpi"))]
        (name == "mpi").then(|| {
            Err(std::io::Error::other(
                "SAFELOAD_EXCHANGE=mpi needs safeload built with the feature `mpi`",
            ))
        })
    }

    fn share(
        &self,
        files: &[safeload_core::extras::ShareFile<'_>],
        ask: &safeload_core::extras::ShareAsk<'_>,
    ) -> safeload_core::extras::Shared {
        NodeExtras.share(files, ask)
    }

    fn warm_up(
        &self,
        files: &[safeload_core::extras::WarmFile<'_>],
        warming: safeload_core::extras::Warming<'_>,
        job: &safeload_core::extras::Job<'_>,
    ) -> safeload_core::Result<Option<safeload_core::report::PrefetchReport>> {
        NodeExtras.warm_up(files, warming, job)
    }
}
