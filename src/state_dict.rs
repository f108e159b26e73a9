//! `StateDict`: the loaded tensors in a deterministic order, the files' metadata, and the report of how each file was read.

use std::collections::{BTreeMap, HashMap};

use crate::report::LoadReport;
use crate::tensor::Tensor;

/// The tensors of a checkpoint, in file order: shard by shard (sorted by
/// name), then by offset within each file.
///
/// Tensors share their file's storage, so a `StateDict` costs one copy of the
/// selected bytes at most (buffered), or none (mapped). It is `Send + Sync`,
/// and tensors taken out of it (cloned) stay valid after it is dropped.
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

    /// The files' `__metadata__` entries merged (the first file that sets a
    /// key wins; shards normally agree, e.g. `{"format": "pt"}`). Each file's
    /// own is in [`FileReport::metadata`](crate::report::FileReport::metadata).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The `metadata` object of the sharded index (e.g. `total_size`), for a
    /// sharded checkpoint that has one: string values as they are, others
    /// (numbers) as their JSON text.
    pub fn index_metadata(&self) -> Option<&BTreeMap<String, String>> {
        self.index_metadata.as_ref()
    }

    /// How each file was read, why, and how fast. `Display` prints it as a
    /// table; [`LoadReport::files`] gives it as data.
    pub fn report(&self) -> &LoadReport {
        &self.report
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
