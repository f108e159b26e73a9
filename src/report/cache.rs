//! What the Hugging Face cache holds, as plain data (feature `remote`, [`hub_cache`](crate::hub_cache)): where it is, its repositories, their revisions and files; with the words `safeload cache` prints.

use std::fmt;
use std::path::PathBuf;

use super::human_bytes;

/// The Hugging Face cache: where it is, and what it holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CacheListing {
    /// Its directory (`HF_HUB_CACHE`, else `$HF_HOME/hub`, else
    /// `~/.cache/huggingface/hub`); `None` where nothing names one.
    #[cfg_attr(
        feature = "serde",
        serde(serialize_with = "crate::worded::maybe_path_text")
    )]
    pub root: Option<PathBuf>,
    /// Whether that directory exists.
    pub exists: bool,
    /// Its model repositories (the one asked for, where one was), by name.
    pub repos: Vec<CachedRepo>,
}

/// One repository of the cache.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CachedRepo {
    /// `org/name`.
    pub repo: String,
    /// Its snapshots, one per commit.
    pub revisions: Vec<CachedRevision>,
    /// Blobs in `blobs/`: files named by a digest (a SHA-256, or a git
    /// blob id), not the lock files another client keeps there.
    pub blobs: usize,
    /// Their bytes.
    pub blob_bytes: u64,
    /// Temporary files in `blobs/` (a download under way, or one a
    /// process that died left).
    pub incomplete: usize,
}

/// One snapshot: a commit, the refs naming it, its files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CachedRevision {
    /// The commit (40 hex digits).
    pub commit: String,
    /// The branches and tags whose ref names it (`main`).
    pub refs: Vec<String>,
    /// Its files, by path.
    pub files: Vec<CachedFile>,
}

/// One file of a snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CachedFile {
    /// Its path in the repository.
    pub path: String,
    /// The blob it links to (its SHA-256 for an LFS file), `None` for a
    /// link that leads nowhere the layout allows or to no blob.
    pub blob: Option<String>,
    /// The blob's length, where there is one.
    pub size: Option<u64>,
}

impl fmt::Display for CacheListing {
    /// `hub cache: <dir>`, then each repository with its revisions and
    /// files.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.root {
            Some(root) if self.exists => writeln!(f, "hub cache: {}", root.display())?,
            Some(root) => writeln!(f, "hub cache: {} (does not exist yet)", root.display())?,
            None => writeln!(f, "hub cache: none (no HF_HUB_CACHE, HF_HOME or HOME)")?,
        }
        for repo in &self.repos {
            write!(
                f,
                "{}  {} blob(s), {}",
                repo.repo,
                repo.blobs,
                human_bytes(repo.blob_bytes)
            )?;
            if repo.incomplete > 0 {
                write!(f, ", {} incomplete", repo.incomplete)?;
            }
            writeln!(f)?;
            for revision in &repo.revisions {
                write!(f, "  {}", revision.commit)?;
                if !revision.refs.is_empty() {
                    write!(f, " ({})", revision.refs.join(", "))?;
                }
                writeln!(f)?;
                for file in &revision.files {
                    match (&file.blob, file.size) {
                        (Some(blob), Some(size)) => {
                            writeln!(f, "    {}  {}  blobs/{blob}", file.path, human_bytes(size))?
                        }
                        // A cache written without links holds the file itself.
                        (None, Some(size)) => {
                            writeln!(f, "    {}  {}", file.path, human_bytes(size))?
                        }
                        _ => writeln!(f, "    {}  (no blob)", file.path)?,
                    }
                }
            }
        }
        Ok(())
    }
}
