//! The sharded index (`*.safetensors.index.json`): its JSON parsed and its shard names confined, from bytes, without I/O.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::de::{Deserializer, MapAccess, Visitor};

/// A parsed `*.safetensors.index.json`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Index {
    /// The `metadata` object: strings as they are, other values as their JSON text.
    pub metadata: Option<BTreeMap<String, String>>,
    /// `weight_map`: tensor name -> shard name, in the order written.
    pub weight_map: Vec<(String, String)>,
}

/// Whether a shard name names a file directly inside the checkpoint directory. Symlinks *at*
/// that name are followed (hub cache snapshots link every file into `blobs/`).
pub(crate) fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && !Path::new(name).is_absolute()
}

/// Parses the bytes of an index file: `{"metadata": {..}?, "weight_map": {"tensor": "shard"}}`.
/// A tensor written twice is kept twice, for the caller to refuse.
pub(crate) fn parse_index(bytes: &[u8]) -> std::result::Result<Index, String> {
    // JSON text is UTF-8 (RFC 8259 §8.1); the parser checks only what it keeps.
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
    let metadata = raw.metadata.map(|object| {
        object
            .into_iter()
            .map(|(key, value)| match value {
                serde_json::Value::String(text) => (key, text),
                other => (key, other.to_string()),
            })
            .collect()
    });
    Ok(Index {
        metadata,
        weight_map,
    })
}

#[derive(serde::Deserialize)]
struct RawIndex {
    #[serde(default)]
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
    weight_map: Option<OrderedPairs>,
}

/// A JSON object of strings in written order, duplicates kept (the caller refuses them).
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
                let mut pairs = Vec::new();
                while let Some(pair) = map.next_entry::<String, String>()? {
                    pairs.push(pair);
                }
                Ok(OrderedPairs(pairs))
            }
        }
        deserializer.deserialize_map(PairsVisitor)
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
