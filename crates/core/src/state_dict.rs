//! `StateDict`: the loaded tensors in a deterministic order, the files' metadata, and the report of how each file was read.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use crate::error::Result;
use crate::report::LoadReport;
use crate::source::Source;
use crate::tensor::Tensor;

/// The tensors of a checkpoint, in file order: shard by shard (sorted by name), then by offset.
/// Tensors share their file's storage: one copy of the selected bytes at most (buffered), or
/// none (mapped).
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("model.safetensors");
/// # let data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().flat_map(|x| x.to_le_bytes()).collect();
/// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 3], &data)?;
/// # safetensors::serialize_to_file([("w", view)], None, &path)?;
/// let sd = safeload::load_state_dict(&path, None)?;
/// assert_eq!((sd.len(), sd.total_bytes()), (1, 24));
/// for (name, tensor) in sd.iter() {
///     assert_eq!((name, tensor.dtype()), ("w", safeload::Dtype::F32));
/// }
/// let tensors: Vec<safeload::Tensor> = sd.into_tensors(); // taken out, no copy
/// assert_eq!(tensors[0].name(), "w");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct StateDict {
    pub(crate) tensors: Vec<Tensor>,
    pub(crate) by_name: HashMap<String, usize>,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) index_metadata: Option<BTreeMap<String, String>>,
    pub(crate) report: LoadReport,
    /// The files the load wrote to a cache, by the path the report names.
    pub(crate) cache_writes: CacheWrites,
}

/// The sources of the files a load wrote to a cache, whose digest checks
/// may outlive the load.
#[derive(Clone, Default)]
pub(crate) struct CacheWrites(pub(crate) Vec<(PathBuf, Arc<dyn Source>)>);

impl std::fmt::Debug for CacheWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(p, _)| p))
            .finish()
    }
}

impl StateDict {
    /// The tensor called `name`, if loaded.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.by_name.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// Whether a tensor called `name` was loaded.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// `(name, tensor)` pairs in file order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Tensor)> + '_ {
        self.tensors.iter().map(|t| (t.name(), t))
    }

    /// The tensors in file order.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// Tensor names in file order.
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.tensors.iter().map(|t| t.name())
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether no tensor was loaded.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The bytes of all tensors' data.
    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(Tensor::nbytes).sum()
    }

    /// The files' `__metadata__` entries merged (the first file that sets a key wins); each
    /// file's own is in [`FileReport::metadata`](crate::report::FileReport::metadata).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The `metadata` object of the sharded index (e.g. `total_size`): strings as they are,
    /// other values as their JSON text.
    pub fn index_metadata(&self) -> Option<&BTreeMap<String, String>> {
        self.index_metadata.as_ref()
    }

    /// How each file was read, why, and how fast.
    pub fn report(&self) -> &LoadReport {
        &self.report
    }

    /// Waits for the digest checks still under way of the files this load wrote to a cache
    /// ([`CacheUse::Checking`](crate::report::CacheUse::Checking)), and returns the first that
    /// did not match as [`ErrorKind::IntegrityMismatch`](crate::ErrorKind::IntegrityMismatch)
    /// (nothing was published). A cache that failed otherwise costs the cache, not the load.
    /// Engines that load from `hf://` call it once they are up.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1], &[0u8; 4])?;
    /// # safetensors::serialize_to_file([("w", view)], None, &path)?;
    /// let sd = safeload::load_state_dict(&path, None)?;   // or "hf://org/model"
    /// sd.settle_cache()?;                                  // the cache's checks, if any
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn settle_cache(&self) -> Result<()> {
        for (path, source) in &self.cache_writes.0 {
            if let Some(write) = source.cache_write() {
                write.settled().checked(path)?;
            }
        }
        Ok(())
    }

    /// Takes the tensors out, in file order.
    pub fn into_tensors(self) -> Vec<Tensor> {
        self.tensors
    }
}

impl<'a> IntoIterator for &'a StateDict {
    type Item = (&'a str, &'a Tensor);
    type IntoIter = Box<dyn Iterator<Item = (&'a str, &'a Tensor)> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}
