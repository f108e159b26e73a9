//! What a cache did for one file of a load, as data: read from it, written to it as the load fetched it, or why not; rendered to words once, here.

use std::fmt;

/// Which cache a file went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "lowercase")
)]
#[non_exhaustive]
pub enum CacheStore {
    /// The Hugging Face cache (`hf://`), shared with the hub's own clients.
    Hub,
    /// The load's cache directory (`s3://`, `gs://`, `az://`, `http(s)://`;
    /// `Loader::cache_dir`).
    Directory,
}

worded! {
/// What a cache did for a file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheUse {
    /// Read from the cache: no byte of it was fetched.
    Hit {
        /// The cache.
        store: CacheStore,
    } = "hit",
    /// Fetched, and written to the cache as it was read; published there
    /// once every byte was in and checked.
    Written {
        /// The cache.
        store: CacheStore,
        /// Bytes an earlier, interrupted load had left in the cache, read
        /// from there and proven by the file's digest.
        resumed: u64,
        /// Bytes an earlier load had left that were fetched again (they
        /// failed the digest, or could not be proven in time).
        refetched: u64,
    } = "written",
    /// Fetched and written to the cache, its digest still being checked on
    /// a thread of its own when the load returned (dropping the file's last
    /// tensor waits for the check).
    Checking {
        /// The cache.
        store: CacheStore,
        /// Bytes of it an earlier, interrupted load had left in the cache,
        /// as for `Written`.
        resumed: u64,
        /// Bytes an earlier load had left that were fetched again, as for
        /// `Written`.
        refetched: u64,
    } = "checking",
    /// Fetched and not cached, for a reason.
    NotCached {
        /// The cache.
        store: CacheStore,
        /// Why.
        why: NotCached,
    } = "not_cached",
}
}

worded! {
/// Why a file fetched through a cache was not written to it (the load is
/// never the worse for it).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotCached {
    /// The load read only part of the file (a filter, a header-only open).
    Partial {
        /// Bytes of it the load read.
        read: u64,
        /// Its length.
        len: u64,
    } = "partial",
    /// The cache's filesystem has no room for it.
    NoSpace = "no_space",
    /// The cache cannot be written.
    Unwritable {
        /// The system's words.
        error: String,
    } = "unwritable",
    /// Another process holds the file's lock in the cache.
    Locked = "locked",
    /// Another process published the same file first.
    PublishedElsewhere = "published_elsewhere",
    /// The bytes do not hash to the digest the store gives for them.
    Mismatch {
        /// The store's digest, in hex.
        expected: String,
        /// The bytes', in hex.
        actual: String,
    } = "mismatch",
    /// The store gives no digest to check the file by.
    NoDigest = "no_digest",
    /// Another local rank writes it, from the node copy they share.
    OtherRank = "other_rank",
    /// The load's bytes of it come from other nodes.
    Exchange = "exchange",
    /// The load was cancelled before the file was complete.
    Cancelled = "cancelled",
}
}

impl fmt::Display for NotCached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotCached::Partial { read, len } => {
                write!(f, "the load read {read} of its {len} bytes")
            }
            NotCached::NoSpace => f.write_str("no space left in the cache"),
            NotCached::Unwritable { error: why } => {
                write!(f, "the cache cannot be written ({why})")
            }
            NotCached::Locked => f.write_str("another process holds its lock"),
            NotCached::PublishedElsewhere => f.write_str("another process published it first"),
            NotCached::Mismatch { expected, actual } => {
                write!(f, "its SHA-256 is {actual}, the store's is {expected}")
            }
            NotCached::NoDigest => f.write_str("the store gives no digest to check it by"),
            NotCached::OtherRank => f.write_str("another local rank writes it"),
            NotCached::Exchange => f.write_str("its bytes come from the other nodes"),
            NotCached::Cancelled => f.write_str("the load was cancelled"),
        }
    }
}

impl NotCached {
    /// The reason of a failed cache operation.
    pub fn of_io(error: &std::io::Error) -> NotCached {
        match error.kind() {
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => {
                NotCached::NoSpace
            }
            _ => NotCached::Unwritable {
                error: error.to_string(),
            },
        }
    }
}

impl CacheStore {
    /// A stable code: `hub`, `directory`.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheStore::Hub => "hub",
            CacheStore::Directory => "directory",
        }
    }
}

impl CacheUse {
    /// Itself, or where the bytes did not hash to the store's digest,
    /// [`ErrorKind::IntegrityMismatch`](crate::ErrorKind::IntegrityMismatch)
    /// on `path`.
    pub fn checked(self, path: &std::path::Path) -> crate::Result<CacheUse> {
        match self {
            CacheUse::NotCached {
                why: NotCached::Mismatch { expected, actual },
                ..
            } => {
                let kind = crate::ErrorKind::IntegrityMismatch { expected, actual };
                Err(crate::Error::new(kind, path))
            }
            other => Ok(other),
        }
    }

    /// The cache it was.
    pub fn store(&self) -> CacheStore {
        match self {
            CacheUse::Hit { store }
            | CacheUse::Written { store, .. }
            | CacheUse::Checking { store, .. }
            | CacheUse::NotCached { store, .. } => *store,
        }
    }
}

impl fmt::Display for CacheUse {
    /// `from the hub cache`, `from the hub, written to the cache`, `from the
    /// store, not cached: <why>`, ...
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (hit, from, cache) = match self.store() {
            CacheStore::Hub => ("from the hub cache", "from the hub", "the cache"),
            CacheStore::Directory => (
                "from the cache directory",
                "from the store",
                "the cache directory",
            ),
        };
        match self {
            CacheUse::Hit { .. } => f.write_str(hit),
            CacheUse::Written {
                resumed, refetched, ..
            }
            | CacheUse::Checking {
                resumed, refetched, ..
            } => {
                write!(f, "{from}, written to {cache}")?;
                if *resumed > 0 {
                    write!(f, ", resuming {resumed} bytes")?;
                }
                if *refetched > 0 {
                    write!(f, ", fetching again {refetched} bytes an earlier load left")?;
                }
                match self {
                    CacheUse::Checking { .. } => f.write_str(", its digest being checked"),
                    _ => Ok(()),
                }
            }
            CacheUse::NotCached { why, .. } => write!(f, "{from}, not cached: {why}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_use_in_words() {
        let hub = CacheStore::Hub;
        let cases = [
            (CacheUse::Hit { store: hub }, "from the hub cache"),
            (
                CacheUse::Written {
                    store: hub,
                    resumed: 0,
                    refetched: 0,
                },
                "from the hub, written to the cache",
            ),
            (
                CacheUse::Written {
                    store: hub,
                    resumed: 1 << 24,
                    refetched: 0,
                },
                "from the hub, written to the cache, resuming 16777216 bytes",
            ),
            (
                CacheUse::Written {
                    store: hub,
                    resumed: 0,
                    refetched: 1 << 20,
                },
                "from the hub, written to the cache, fetching again 1048576 bytes an earlier \
                 load left",
            ),
            (
                CacheUse::Checking {
                    store: hub,
                    resumed: 0,
                    refetched: 0,
                },
                "from the hub, written to the cache, its digest being checked",
            ),
            (
                CacheUse::Checking {
                    store: CacheStore::Directory,
                    resumed: 5,
                    refetched: 0,
                },
                "from the store, written to the cache directory, resuming 5 bytes, its digest \
                 being checked",
            ),
            (
                CacheUse::NotCached {
                    store: hub,
                    why: NotCached::NoSpace,
                },
                "from the hub, not cached: no space left in the cache",
            ),
            (
                CacheUse::NotCached {
                    store: CacheStore::Directory,
                    why: NotCached::Partial {
                        read: 1 << 20,
                        len: 4 << 20,
                    },
                },
                "from the store, not cached: the load read 1048576 of its 4194304 bytes",
            ),
            (
                CacheUse::Hit {
                    store: CacheStore::Directory,
                },
                "from the cache directory",
            ),
        ];
        for (usage, words) in cases {
            assert_eq!(usage.to_string(), words);
        }
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        assert_eq!(NotCached::of_io(&full), NotCached::NoSpace);
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert_eq!(NotCached::of_io(&denied).as_str(), "unwritable");
    }
}
