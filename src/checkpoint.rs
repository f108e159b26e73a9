//! Turning a path into the list of shard files to load, and parsing and checking the index.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};

use crate::error::{Error, ErrorKind, Result};

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

/// A parsed `*.safetensors.index.json`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Index {
    /// The `metadata` object, if any.
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// `weight_map`: tensor name -> shard name, in the order written.
    pub weight_map: Vec<(String, String)>,
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

/// A shard name from an index is accepted only if it names a file directly
/// inside the checkpoint directory: not empty, not `.` or `..`, no path
/// separator (either kind), no NUL, not absolute. Symlinks *at* that name are
/// followed (Hugging Face cache snapshots link every file into `blobs/`); only
/// the name itself is confined.
pub(crate) fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && !Path::new(name).is_absolute()
}

/// Parses the bytes of an index file. Pure: no I/O.
///
/// Errors (as a message) on anything that is not
/// `{"metadata": {...}?, "weight_map": {"tensor": "shard", ...}}`. A tensor
/// written twice in `weight_map` is kept twice, for the caller to refuse.
pub(crate) fn parse_index(bytes: &[u8]) -> std::result::Result<Index, String> {
    // JSON text is UTF-8 (RFC 8259 §8.1); the parser checks only what it
    // keeps, so check all of it.
    std::str::from_utf8(bytes)
        .map_err(|e| format!("not UTF-8, as JSON text must be (unicode, RFC 8259): {e}"))?;
    // A derived struct would also accept a JSON array of its fields.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err("expected a JSON object".to_string());
    }
    let raw: RawIndex = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let weight_map = raw
        .weight_map
        .ok_or_else(|| "missing \"weight_map\"".to_string())?
        .0;
    Ok(Index {
        metadata: raw.metadata,
        weight_map,
    })
}

#[derive(serde::Deserialize)]
struct RawIndex {
    #[serde(default)]
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
    weight_map: Option<OrderedPairs>,
}

/// A JSON object of string values kept in written order, duplicates
/// included (a plain map would silently keep the last of two entries; the
/// caller refuses them by name).
struct OrderedPairs(Vec<(String, String)>);

impl<'de> serde::Deserialize<'de> for OrderedPairs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct PairsVisitor;
        impl<'de> Visitor<'de> for PairsVisitor {
            type Value = OrderedPairs;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object mapping tensor names to shard file names")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut pairs: Vec<(String, String)> = Vec::new();
                while let Some(pair) = map.next_entry::<String, String>()? {
                    pairs.push(pair);
                }
                Ok(OrderedPairs(pairs))
            }
        }
        deserializer.deserialize_map(PairsVisitor)
    }
}

/// Checks that the keys of a JSON object are unique, without keeping values.
/// Used on safetensors headers, whose parser would keep the last of two
/// entries with one name.
pub(crate) struct UniqueKeys;

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct KeysVisitor;
        impl<'de> Visitor<'de> for KeysVisitor {
            type Value = UniqueKeys;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut seen = std::collections::HashSet::new();
                while let Some(key) = map.next_key::<String>()? {
                    map.next_value::<IgnoredAny>()?;
                    if !seen.insert(key.clone()) {
                        return Err(de::Error::custom(format!("tensor {key:?} appears twice")));
                    }
                }
                Ok(UniqueKeys)
            }
        }
        deserializer.deserialize_map(KeysVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_only() {
        for ok in ["model-00001-of-00002.safetensors", "a..b.safetensors", "x"] {
            assert!(is_plain_file_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "../x", "/abs", "a/b", "a\\b", "a\0b"] {
            assert!(!is_plain_file_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn index_keeps_order_and_refuses_duplicates() {
        let index = parse_index(br#"{"metadata":{"total_size":8},"weight_map":{"b":"2","a":"1"}}"#)
            .unwrap();
        assert_eq!(
            index.weight_map,
            vec![("b".into(), "2".into()), ("a".into(), "1".into())]
        );
        assert!(index.metadata.is_some());
        let twice = parse_index(br#"{"weight_map":{"a":"1","a":"2"}}"#).unwrap();
        assert_eq!(twice.weight_map.len(), 2);
        assert!(parse_index(br#"[null, {"a":"1"}]"#).is_err());
        assert!(parse_index(b"{}").unwrap_err().contains("weight_map"));
        assert!(parse_index(b"[1]").is_err());
        assert!(parse_index(br#"{"weight_map":{"a":1}}"#).is_err());
    }
}
