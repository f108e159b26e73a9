//! The remote stores and the hub as a load's extras: an address resolved through its cache to a `Remote`, whose files a load takes as sources.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::{Remote, resolve};
use crate::error::Result;
use crate::extras::{Caching, Extras, RemoteCheckpoint, Resolution};
use crate::mount::MountTable;
use crate::source::Source;

/// The remote stores and the hub (feature `remote`) as a load's extras:
/// `s3://`, `gs://`, `az://`, `http(s)://` and `hf://`, through their caches.
#[derive(Debug, Clone, Copy, Default)]
pub struct RemoteExtras;

impl Extras for RemoteExtras {
    fn resolve(&self, address: &str, caching: Caching<'_>) -> Option<Result<Resolution>> {
        let Caching {
            hub,
            dir,
            verify,
            cancel,
        } = caching;
        let resolved = resolve(address, hub, dir, verify, cancel);
        Some(resolved.map(|(remote, found)| Resolution {
            checkpoint: Arc::new(remote),
            found,
        }))
    }
}

impl RemoteCheckpoint for Remote {
    fn shown(&self, name: &str) -> PathBuf {
        Remote::shown(self, name)
    }

    fn take(&self, name: &str, table: Option<&MountTable>) -> Result<Arc<dyn Source>> {
        Remote::take(self, name, table)
    }

    fn extra_files(&self) -> BTreeMap<String, Option<PathBuf>> {
        self.extra.clone()
    }
}
