//! A path to the checkpoint's files: a `.safetensors` file, an index, or a directory resolved to its shard files, and the shards' headers checked against the index.

use std::collections::{BTreeSet, HashMap};

use crate::format::header::Header;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Error, ErrorKind, Result};
use crate::format::index::{Index, is_plain_file_name, parse_index};

/// The file name of a single-file checkpoint in a directory.
pub(crate) const SINGLE_FILE: &str = "model.safetensors";
/// The file name of a sharded checkpoint's index in a directory.
pub(crate) const INDEX_FILE: &str = "model.safetensors.index.json";
/// Indexes of real checkpoints are a few MiB; a larger one is refused before
/// it is read, so that a hostile file cannot make us allocate without bound.
pub(crate) const MAX_INDEX_BYTES: u64 = 100_000_000;

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShardFile {
    /// The name as the index writes it, or the file name of a single file.
    pub name: String,
    /// The path to open: the checkpoint directory joined with `name`, or the
    /// path the caller gave for a single file. Not canonicalized, so that a
    /// symlinked file (a Hugging Face cache snapshot) keeps its name in errors.
    pub path: PathBuf,
}

/// What a path resolved to.
#[derive(Debug, Clone)]
pub(crate) struct Checkpoint {
    /// The shard files, in load order (sorted by name for an index).
    pub shards: Vec<ShardFile>,
    /// The parsed index, for a sharded checkpoint.
    pub index: Option<Index>,
    /// The index file's path, for a sharded checkpoint.
    pub index_path: Option<PathBuf>,
}

/// Resolves `path` (a `.safetensors` file, an index, or a directory holding one
/// of them) into the shard files to load.
pub(crate) fn resolve(path: &Path) -> Result<Checkpoint> {
    let meta = fs::metadata(path).map_err(|e| Error::io("reading metadata of", path, None, e))?;
    if meta.is_dir() {
        return resolve_dir(path);
    }
    if is_index_name(path) {
        return resolve_index(path);
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(Checkpoint {
        shards: vec![ShardFile {
            name,
            path: path.to_path_buf(),
        }],
        index: None,
        index_path: None,
    })
}

fn is_index_name(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".safetensors.index.json"))
}

fn resolve_dir(dir: &Path) -> Result<Checkpoint> {
    // The same order of preference as the Hugging Face loaders: the single
    // file first, then the index.
    let single = dir.join(SINGLE_FILE);
    if single.is_file() {
        return resolve(&single);
    }
    let index = dir.join(INDEX_FILE);
    if index.is_file() {
        return resolve_index(&index);
    }
    let entries = fs::read_dir(dir).map_err(|e| Error::io("listing", dir, None, e))?;
    let mut safetensors = BTreeSet::new();
    let mut indexes = BTreeSet::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("listing", dir, None, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".safetensors.index.json") {
            indexes.insert(name);
        } else if name.ends_with(".safetensors") && entry.path().is_file() {
            safetensors.insert(name);
        }
    }
    if indexes.is_empty() && safetensors.len() == 1 {
        if let Some(name) = safetensors.first() {
            return resolve(&dir.join(name));
        }
    }
    if indexes.len() == 1 && safetensors.len() > 1 {
        if let Some(name) = indexes.first() {
            return resolve_index(&dir.join(name));
        }
    }
    let found = indexes.into_iter().chain(safetensors).collect();
    Err(Error::new(ErrorKind::NoCheckpoint { found }, dir))
}

fn resolve_index(index_path: &Path) -> Result<Checkpoint> {
    let bytes = read_capped(index_path, MAX_INDEX_BYTES)?;
    let index = parse_index(&bytes)
        .map_err(|reason| Error::new(ErrorKind::InvalidIndex { reason }, index_path))?;
    let dir = index_path.parent().unwrap_or(Path::new("."));

    let mut seen_tensors: HashMap<&str, ()> = HashMap::with_capacity(index.weight_map.len());
    let mut names = BTreeSet::new();
    for (tensor, shard) in &index.weight_map {
        if seen_tensors.insert(tensor, ()).is_some() {
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
            path: dir.join(name),
        })
        .collect();
    Ok(Checkpoint {
        shards,
        index: Some(index),
        index_path: Some(index_path.to_path_buf()),
    })
}

impl Checkpoint {
    /// Refuses a checkpoint whose opened shards (path, parsed header) disagree
    /// with each other or with the index: a tensor in two shards, or an index
    /// entry whose shard lacks it. Shards not opened (a filter needs nothing
    /// from them) are not checked.
    pub(crate) fn check_headers(&self, opened: &[(&Path, &Header)]) -> Result<()> {
        let checkpoint = self;
        let mut owner: HashMap<&str, usize> = HashMap::new();
        for (i, (path, header)) in opened.iter().enumerate() {
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
        let Some(index) = &checkpoint.index else {
            return Ok(());
        };
        let opened_at: HashMap<&Path, usize> = opened
            .iter()
            .enumerate()
            .map(|(i, (p, _))| (*p, i))
            .collect();
        let shard_paths: HashMap<&str, &Path> = checkpoint
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
/// allocating for it.
fn read_capped(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let file = crate::os::open_regular(path).map_err(|e| Error::io("opening", path, None, e))?;
    let len = file
        .metadata()
        .map_err(|e| Error::io("reading metadata of", path, None, e))?
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
        .map_err(|e| Error::io("reading", path, None, e))?;
    Ok(bytes)
}
