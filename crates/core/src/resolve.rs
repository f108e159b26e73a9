//! Resolving a path to a checkpoint's files: a `.safetensors` file, an index, or a directory, opened once, to its shard files; and the shards' headers checked against the index.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Operation, Result};
pub(crate) use crate::extras::Caching;
use crate::extras::{Extras, Found, RemoteCheckpoint, Resolution};
use crate::format::header::Header;
use crate::format::index::{Index, is_plain_file_name, parse_index};
use crate::format::{INDEX_FILE, MAX_INDEX_BYTES, SINGLE_FILE};
use crate::os;

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShardFile {
    /// The name as the index writes it, or the file name of a single file.
    pub name: String,
    /// The path to open, not canonicalized: a symlinked file (a Hugging
    /// Face cache snapshot) keeps its name in errors.
    pub path: PathBuf,
}

/// What a path resolved to.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    /// The shard files, in load order (sorted by name for an index).
    pub shards: Vec<ShardFile>,
    /// The parsed index, for a sharded checkpoint.
    pub index: Option<Index>,
    /// The index file's path, for a sharded checkpoint.
    pub index_path: Option<PathBuf>,
    /// The checkpoint directory, opened once: the index and every shard are
    /// opened through it, so that one load sees one revision even while a
    /// symlink on the way (`current -> snapshots/<rev>`) is flipped.
    dir: Option<Arc<os::Dir>>,
    /// A remote checkpoint's place, its files opened through it.
    remote: Option<Arc<dyn RemoteCheckpoint>>,
}

/// Whether `path` is a remote address (a scheme the feature `remote` reads)
/// rather than a local path.
pub(crate) fn is_remote(path: &Path) -> bool {
    let Some(text) = path.to_str() else {
        return false;
    };
    text.split_once("://").is_some_and(|(scheme, _)| {
        matches!(
            scheme.to_ascii_lowercase().as_str(),
            "s3" | "s3a" | "gs" | "az" | "abfs" | "abfss" | "http" | "https" | "hf"
        )
    })
}

/// Resolves `path` (a `.safetensors` file, an index, a directory holding one,
/// or a remote address `extras` read through `caching`) into its shards.
pub(crate) fn resolve(path: &Path, caching: Caching<'_>, extras: &dyn Extras) -> Result<Resolved> {
    if is_remote(path) {
        return resolve_remote(path, caching, extras);
    }
    let meta = fs::metadata(path).map_err(|e| Error::io(Operation::Stat, path, None, e))?;
    if meta.is_dir() {
        let dir = os::Dir::open(path).map_err(|e| Error::io(Operation::Open, path, None, e))?;
        return resolve_dir(path, Arc::new(dir));
    }
    if let Some(index_name) = index_name(path) {
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = os::Dir::open(parent).map_err(|e| Error::io(Operation::Open, parent, None, e))?;
        return resolve_index(parent, Arc::new(dir), index_name);
    }
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    Ok(single(name.into_owned(), path.to_path_buf(), None))
}

/// The file name of an index (`*.safetensors.index.json`), if `path` names one.
fn index_name(path: &Path) -> Option<&str> {
    path.file_name()
        .and_then(|n| n.to_str())
        .filter(|n| n.ends_with(".safetensors.index.json"))
}

fn resolve_dir(path: &Path, dir: Arc<os::Dir>) -> Result<Resolved> {
    // The same order of preference as the Hugging Face loaders: the single
    // file first, then the index.
    if dir.is_file(SINGLE_FILE) {
        return Ok(single(
            SINGLE_FILE.into(),
            path.join(SINGLE_FILE),
            Some(dir),
        ));
    }
    if dir.is_file(INDEX_FILE) {
        return resolve_index(path, dir, INDEX_FILE);
    }
    let names = dir
        .names()
        .map_err(|e| Error::io(Operation::List, path, None, e))?;
    let mut safetensors = BTreeSet::new();
    let mut indexes = BTreeSet::new();
    for name in names {
        if name.ends_with(".safetensors.index.json") {
            indexes.insert(name);
        } else if name.ends_with(".safetensors") && dir.is_file(&name) {
            safetensors.insert(name);
        }
    }
    if indexes.is_empty() && safetensors.len() == 1 {
        if let Some(name) = safetensors.pop_first() {
            let file = path.join(&name);
            return Ok(single(name, file, Some(dir)));
        }
    }
    if indexes.len() == 1 && safetensors.len() > 1 {
        if let Some(name) = indexes.first() {
            return resolve_index(path, dir, name);
        }
    }
    let found = indexes.into_iter().chain(safetensors).collect();
    Err(Error::new(ErrorKind::NoCheckpoint { found }, path))
}

/// A checkpoint of one local file, `name` at `path`, opened through `dir`.
fn single(name: String, path: PathBuf, dir: Option<Arc<os::Dir>>) -> Resolved {
    Resolved {
        shards: vec![ShardFile { name, path }],
        index: None,
        index_path: None,
        dir,
        remote: None,
    }
}

fn resolve_index(dir_path: &Path, dir: Arc<os::Dir>, name: &str) -> Result<Resolved> {
    let index_path = dir_path.join(name);
    let file = dir
        .open_regular(name)
        .map_err(|e| Error::io(Operation::Open, &index_path, None, e))?;
    let bytes = read_capped(&file, &index_path, MAX_INDEX_BYTES)?;
    let (index, shards) = index_shards(&bytes, &index_path, |name| dir_path.join(name))?;
    Ok(Resolved {
        shards,
        index: Some(index),
        index_path: Some(index_path),
        dir: Some(dir),
        remote: None,
    })
}

/// Parses the index at `index_path` and lists its shards (sorted by name,
/// at `path_of(name)`), refusing a tensor named twice and a shard name that
/// is not a plain file name.
fn index_shards(
    bytes: &[u8],
    index_path: &Path,
    path_of: impl Fn(&str) -> PathBuf,
) -> Result<(Index, Vec<ShardFile>)> {
    let index = parse_index(bytes)
        .map_err(|reason| Error::new(ErrorKind::InvalidIndex { reason }, index_path))?;
    let mut seen_tensors = HashSet::with_capacity(index.weight_map.len());
    let mut names = BTreeSet::new();
    for (tensor, shard) in &index.weight_map {
        if !seen_tensors.insert(tensor.as_str()) {
            return Err(Error::new(
                ErrorKind::DuplicateTensor {
                    tensor: tensor.clone(),
                    first: index_path.to_path_buf(),
                },
                index_path,
            ));
        }
        if !is_plain_file_name(shard) {
            return Err(Error::new(
                ErrorKind::UnsafeShardName {
                    name: shard.clone(),
                },
                index_path,
            ));
        }
        names.insert(shard.as_str());
    }
    let shards = names
        .into_iter()
        .map(|name| ShardFile {
            name: name.to_string(),
            path: path_of(name),
        })
        .collect();
    Ok((index, shards))
}

/// A remote address resolved by the load's `extras`; an error where they
/// read no such address.
fn resolve_remote(path: &Path, caching: Caching<'_>, extras: &dyn Extras) -> Result<Resolved> {
    let text = path.to_str().unwrap_or_default();
    let Some(resolution) = extras.resolve(text, caching) else {
        return Err(Error::remote_failed(
            Operation::Open,
            path,
            None,
            crate::error::RemoteFailure::Unsupported,
            "remote checkpoints need safeload's cargo feature `remote`",
        ));
    };
    let Resolution { checkpoint, found } = resolution?;
    let (shards, index, index_path) = match found {
        Found::Single(name) => {
            let path = checkpoint.shown(&name);
            (vec![ShardFile { name, path }], None, None)
        }
        Found::Index(name, bytes) => {
            let index_path = checkpoint.shown(&name);
            let (index, shards) = index_shards(&bytes, &index_path, |name| checkpoint.shown(name))?;
            (shards, Some(index), Some(index_path))
        }
    };
    Ok(Resolved {
        shards,
        index,
        index_path,
        dir: None,
        remote: Some(checkpoint),
    })
}

impl Resolved {
    /// The remote checkpoint its files are opened through.
    pub(crate) fn remote(&self) -> Option<&dyn RemoteCheckpoint> {
        self.remote.as_deref()
    }

    /// The other files brought beside the weights
    /// ([`RemoteCheckpoint::extra_files`]).
    pub(crate) fn extra_files(&self) -> std::collections::BTreeMap<String, Option<PathBuf>> {
        self.remote
            .as_ref()
            .map(|remote| remote.extra_files())
            .unwrap_or_default()
    }

    /// Whether its files are remote objects.
    pub(crate) fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// Opens a shard: through the checkpoint directory, else by its path.
    pub(crate) fn open(&self, shard: &ShardFile) -> io::Result<File> {
        self.open_file(&shard.name, &shard.path)
    }

    /// Opens the index file, where there is one, as [`open`](Self::open).
    pub(crate) fn open_index(&self) -> Option<io::Result<File>> {
        let path = self.index_path.as_deref()?;
        Some(self.open_file(path.file_name()?.to_str()?, path))
    }

    fn open_file(&self, name: &str, path: &Path) -> io::Result<File> {
        match &self.dir {
            Some(dir) => dir.open_regular(name),
            None => os::open_regular(path),
        }
    }

    /// Refuses a checkpoint whose opened shards (path, header) disagree with
    /// each other or with the index: a tensor in two shards, or an index
    /// entry whose shard lacks it. Shards not opened are not checked.
    pub(crate) fn check_headers(&self, opened: &[(&Path, &Header)]) -> Result<()> {
        // One file without an index needs no map of owners (a header names
        // a tensor once).
        let count = if opened.len() > 1 || self.index.is_some() {
            opened.iter().map(|(_, h)| h.tensors.len()).sum()
        } else {
            0
        };
        let mut owner: HashMap<&str, usize> = HashMap::with_capacity(count);
        for (i, (path, header)) in opened.iter().enumerate().filter(|_| count > 0) {
            for tensor in &header.tensors {
                if let Some(first) = owner.insert(&tensor.name, i) {
                    let first = opened
                        .get(first)
                        .map(|(p, _)| p.to_path_buf())
                        .unwrap_or_default();
                    return Err(Error::new(
                        ErrorKind::DuplicateTensor {
                            tensor: tensor.name.clone(),
                            first,
                        },
                        path,
                    ));
                }
            }
        }
        let Some(index) = &self.index else {
            return Ok(());
        };
        let opened_at: HashMap<&Path, usize> = opened
            .iter()
            .enumerate()
            .map(|(i, (p, _))| (*p, i))
            .collect();
        let shard_paths: HashMap<&str, &Path> = self
            .shards
            .iter()
            .map(|s| (s.name.as_str(), s.path.as_path()))
            .collect();
        for (tensor, shard_name) in &index.weight_map {
            let Some(&path) = shard_paths.get(shard_name.as_str()) else {
                continue;
            };
            let Some(&shard_index) = opened_at.get(path) else {
                continue; // not opened: the filter needs nothing from it
            };
            if owner.get(tensor.as_str()) != Some(&shard_index) {
                return Err(Error::new(
                    ErrorKind::TensorNotInShard {
                        tensor: tensor.clone(),
                        shard: shard_name.clone(),
                    },
                    path,
                ));
            }
        }
        Ok(())
    }
}

/// Reads a whole small file, refusing one larger than `limit` before
/// allocating; one that shrank while read is a size mismatch, not bad JSON.
fn read_capped(file: &File, path: &Path, limit: u64) -> Result<Vec<u8>> {
    let len = file
        .metadata()
        .map_err(|e| Error::io(Operation::Stat, path, None, e))?
        .len();
    if len > limit {
        return Err(Error::new(
            ErrorKind::InvalidIndex {
                reason: format!("index of {len} bytes exceeds the limit of {limit} bytes"),
            },
            path,
        ));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    // `take` guards against a file that grows after the size check.
    file.take(limit)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(Operation::Read, path, None, e))?;
    let read = bytes.len() as u64;
    if read < len {
        return Err(Error::new(
            ErrorKind::SizeMismatch {
                expected: len,
                actual: read,
            },
            path,
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A load without extras does not look for a local file named like an address: it says
    /// which feature reads it.
    #[test]
    fn an_address_without_the_remote_feature_says_so() {
        for url in ["s3://bucket/model", "hf://org/repo", "https://host/m/"] {
            let e =
                resolve(Path::new(url), Caching::default(), &crate::extras::NoExtras).unwrap_err();
            assert!(matches!(e.kind(), ErrorKind::Remote { .. }), "{e}");
            assert!(e.to_string().contains("feature `remote`"), "{e}");
            assert_eq!(e.path(), Some(Path::new(url)));
        }
    }

    #[test]
    fn addresses_are_told_from_paths() {
        for remote in [
            "s3://b",
            "GS://b/k",
            "az://c",
            "https://h/x",
            "hf://o/r",
            "abfs://c/x",
        ] {
            assert!(is_remote(Path::new(remote)), "{remote}");
        }
        for local in [
            "model.safetensors",
            "/data/s3://x",
            "file:///x",
            "C:\\x",
            "",
        ] {
            assert!(!is_remote(Path::new(local)), "{local}");
        }
    }
}
