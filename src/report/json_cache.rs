//! `serde::Serialize` for what the caches report (feature `serde`): what a cache did for a file (`CacheUse`, `NotCached`), in the schema of `json.rs` (`CacheStore` and the hub cache's listing derive theirs).

use serde::ser::{Serialize, Serializer};

use super::{tagged, value};
use crate::report::{CacheUse, NotCached};

impl Serialize for CacheUse {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let data = match self {
            CacheUse::Hit { store } | CacheUse::Written { store } => fields!(S; store),
            CacheUse::NotCached { store, why } => fields!(S; store, why),
        };
        tagged(serializer, self.as_str(), self.to_string(), data)
    }
}

impl Serialize for NotCached {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let data = match self {
            NotCached::Partial { read, len } => fields!(S; read, len),
            NotCached::Unwritable(error) => fields!(S; error),
            NotCached::Mismatch { expected, actual } => fields!(S; expected, actual),
            NotCached::NoSpace
            | NotCached::Locked
            | NotCached::PublishedElsewhere
            | NotCached::NoDigest
            | NotCached::OtherRank
            | NotCached::Exchange
            | NotCached::Cancelled => Vec::new(),
        };
        tagged(serializer, self.as_str(), self.to_string(), data)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    /// The documented remote file's `cache` objects are what the types give, and every
    /// code of `NotCached` is listed in the report module's docs.
    #[test]
    fn the_documented_cache_objects_are_what_the_types_give() {
        use crate::report::{CacheStore, CacheUse, NotCached};
        let example: Value = serde_json::from_str(include_str!("example_cache.json")).unwrap();
        let hub = CacheStore::Hub;
        let uses = [
            CacheUse::Written { store: hub },
            CacheUse::Hit { store: hub },
            CacheUse::NotCached {
                store: hub,
                why: NotCached::Partial {
                    read: 1 << 20,
                    len: 4 << 20,
                },
            },
        ];
        for (i, want) in uses.iter().enumerate() {
            assert_eq!(
                example[i]["cache"],
                serde_json::to_value(want).unwrap(),
                "{i}"
            );
        }
        let docs = include_str!("mod.rs");
        let every = [
            NotCached::Partial { read: 0, len: 0 },
            NotCached::NoSpace,
            NotCached::Unwritable(String::new()),
            NotCached::Locked,
            NotCached::PublishedElsewhere,
            NotCached::Mismatch {
                expected: String::new(),
                actual: String::new(),
            },
            NotCached::NoDigest,
            NotCached::OtherRank,
            NotCached::Exchange,
            NotCached::Cancelled,
        ];
        for why in every {
            let code = format!("`{}`", why.as_str());
            assert!(docs.contains(&code), "{code} is not in the report's docs");
        }
    }
}
