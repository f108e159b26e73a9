//! What this build reads beyond local paths: the extras its cargo features
//! compile in, which [`Loader`](crate::Loader) and [`Checkpoint`](crate::Checkpoint)
//! resolve addresses with (and join the exchange between nodes
//! `SAFELOAD_EXCHANGE` names through).

pub use safeload_core::extras::{Extras, NoExtras};

/// The extras of this build: with the feature `remote`, the object stores
/// and the Hugging Face hub, through their caches; with the feature `mpi`,
/// the exchange between nodes that `SAFELOAD_EXCHANGE=mpi` joins; none
/// without.
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
}
