//! Tests of what the caches report, in JSON: a remote file's documented `cache` objects are what the types give, and every code of `NotCached` is in the report's docs.

use serde_json::Value;

/// The documented remote file's `cache` objects are what the types give, and every
/// code of `NotCached` is listed in the report module's docs.
#[test]
fn the_documented_cache_objects_are_what_the_types_give() {
    use crate::report::{CacheStore, CacheUse, NotCached};
    let example: Value = serde_json::from_str(include_str!("example_cache.json")).unwrap();
    let hub = CacheStore::Hub;
    let uses = [
        CacheUse::Written {
            store: hub,
            resumed: 16 << 20,
            refetched: 0,
        },
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
        NotCached::Unwritable {
            error: String::new(),
        },
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
