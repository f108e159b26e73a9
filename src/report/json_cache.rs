//! `serde::Serialize` for what the caches report (feature `serde`): what a cache did for a file (`CacheUse`, `NotCached`, `CacheStore`) and what the hub cache holds (`CacheListing`), in the schema of `json.rs`.

use serde::ser::{Serialize, Serializer};

use super::{tagged, text, value};
use crate::report::{CacheListing, CacheStore, CacheUse, NotCached};

impl Serialize for CacheStore {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

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
            | NotCached::Exchange => Vec::new(),
        };
        tagged(serializer, self.as_str(), self.to_string(), data)
    }
}

impl Serialize for CacheListing {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct View<'a> {
            root: Option<String>,
            exists: bool,
            repos: Vec<Repo<'a>>,
        }
        #[derive(serde::Serialize)]
        struct Repo<'a> {
            repo: &'a str,
            revisions: Vec<Revision<'a>>,
            blobs: usize,
            blob_bytes: u64,
            incomplete: usize,
        }
        #[derive(serde::Serialize)]
        struct Revision<'a> {
            commit: &'a str,
            refs: &'a [String],
            files: Vec<File<'a>>,
        }
        #[derive(serde::Serialize)]
        struct File<'a> {
            path: &'a str,
            blob: Option<&'a str>,
            size: Option<u64>,
        }
        View {
            root: self.root.as_deref().map(text),
            exists: self.exists,
            repos: self
                .repos
                .iter()
                .map(|r| Repo {
                    repo: &r.repo,
                    revisions: r
                        .revisions
                        .iter()
                        .map(|v| Revision {
                            commit: &v.commit,
                            refs: &v.refs,
                            files: v
                                .files
                                .iter()
                                .map(|f| File {
                                    path: &f.path,
                                    blob: f.blob.as_deref(),
                                    size: f.size,
                                })
                                .collect(),
                        })
                        .collect(),
                    blobs: r.blobs,
                    blob_bytes: r.blob_bytes,
                    incomplete: r.incomplete,
                })
                .collect(),
        }
        .serialize(serializer)
    }
}
