//! What the Hugging Face cache holds, as plain data (feature `remote`, [`hub_cache`](crate::hub_cache)): where it is, its repositories, their revisions and files; with the words `safeload cache` prints.

use std::fmt;
use std::path::PathBuf;

use safeload_core::report::human_bytes;
use safeload_core::worded;

/// The Hugging Face cache: where it is, and what it holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CacheListing {
    /// Its directory; `None` where nothing names one.
    #[cfg_attr(
        feature = "serde",
        serde(serialize_with = "safeload_core::worded::maybe_path_text")
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
    /// Blobs in `blobs/`: files named by a digest (not lock files).
    pub blobs: usize,
    /// Their bytes.
    pub blob_bytes: u64,
    /// Temporary files in `blobs/` (a download under way, or a dead one's).
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
    /// The blob it links to, `None` for a link that leads to no blob.
    pub blob: Option<String>,
    /// The blob's length, where there is one.
    pub size: Option<u64>,
}

impl fmt::Display for CacheListing {
    /// `hub cache: <dir>`, then each repository with its revisions and files.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.root {
            Some(root) if self.exists => writeln!(f, "hub cache: {}", root.display())?,
            Some(root) => writeln!(f, "hub cache: {} (does not exist yet)", root.display())?,
            None => writeln!(f, "hub cache: none (no HF_HUB_CACHE, HF_HOME or HOME)")?,
        }
        for repo in &self.repos {
            let size = human_bytes(repo.blob_bytes);
            write!(f, "{}  {} blob(s), {size}", repo.repo, repo.blobs)?;
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

/// Whether a housekeeping call of the hub cache removes what it finds, or
/// only says what it would remove (feature `remote`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum RemoveMode {
    /// Removes nothing: the result lists what would go, and its bytes.
    #[default]
    DryRun,
    /// Removes what the result lists.
    Remove,
}

/// What a housekeeping call of the hub cache removed (or would remove), and
/// what it kept, with why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CacheRemoval {
    /// The cache's directory.
    #[cfg_attr(
        feature = "serde",
        serde(serialize_with = "safeload_core::worded::path_text")
    )]
    pub root: PathBuf,
    /// A dry run (nothing removed), or a removal.
    pub mode: RemoveMode,
    /// What went (or would go), children before their folder.
    pub removed: Vec<RemovedEntry>,
    /// The bytes of [`removed`](Self::removed): the same in a dry run as in the removal.
    pub bytes: u64,
    /// What was kept, and why.
    pub kept: Vec<KeptEntry>,
}

/// One name removed from the cache (or that a dry run would remove).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RemovedEntry {
    /// Its path (a link's own, never its target's).
    #[cfg_attr(
        feature = "serde",
        serde(serialize_with = "safeload_core::worded::path_text")
    )]
    pub path: PathBuf,
    /// What it was.
    pub kind: CacheEntryKind,
    /// The bytes it held: a regular file's length; 0 for a link or a folder.
    pub bytes: u64,
}

/// What a name of the hub cache is, for what housekeeping removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum CacheEntryKind {
    /// A blob of `blobs/`: a file's bytes (or a link into the shared store).
    Blob,
    /// A temporary file of a download in `blobs/`.
    Incomplete,
    /// A ref of `refs/` (a branch or tag's commit).
    Ref,
    /// A snapshot's link to a blob (or any other link; never followed).
    Link,
    /// Any other file (a snapshot file written without links, a marker).
    File,
    /// A folder, emptied first.
    Folder,
}

impl CacheEntryKind {
    /// A short word for it: `blob`, `incomplete`, `ref`, `link`, `file`, `folder`.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheEntryKind::Blob => "blob",
            CacheEntryKind::Incomplete => "incomplete",
            CacheEntryKind::Ref => "ref",
            CacheEntryKind::Link => "link",
            CacheEntryKind::File => "file",
            CacheEntryKind::Folder => "folder",
        }
    }
}

/// A name housekeeping would have removed, kept, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct KeptEntry {
    /// Its path.
    #[cfg_attr(
        feature = "serde",
        serde(serialize_with = "safeload_core::worded::path_text")
    )]
    pub path: PathBuf,
    /// Why it was kept.
    pub why: KeepReason,
}

worded! {
/// Why housekeeping kept a name of the hub cache.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeepReason {
    /// Another user owns it (`lstat`): never removed for them.
    OtherOwner {
        /// Its owner's uid.
        owner: u32,
    } = "other_owner",
    /// Its blob's lock is held: a live writer is at work on it.
    Locked = "locked",
    /// A temporary file written to within the hour: a download may be under way.
    Recent = "recent",
    /// A folder that holds something kept.
    HoldsKept = "holds_kept",
    /// Looking at it or removing it failed.
    Failed {
        /// The OS's words.
        error: String,
    } = "failed",
}
}

impl fmt::Display for KeepReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeepReason::OtherOwner { owner } => write!(f, "owned by uid {owner}, not this user"),
            KeepReason::Locked => f.write_str("its lock is held by a live writer"),
            KeepReason::Recent => {
                f.write_str("written to within the hour: a download may be under way")
            }
            KeepReason::HoldsKept => f.write_str("holds something kept"),
            KeepReason::Failed { error } => write!(f, "could not be removed: {error}"),
        }
    }
}

impl fmt::Display for CacheRemoval {
    /// `hub cache: <dir>`, each name removed with its kind and bytes, the total, then
    /// each name kept and why.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "hub cache: {}", self.root.display())?;
        let verb = match self.mode {
            RemoveMode::DryRun => "would remove",
            RemoveMode::Remove => "removed",
        };
        for entry in &self.removed {
            let (kind, path) = (entry.kind.as_str(), entry.path.display());
            write!(f, "  {verb} {kind} {path}")?;
            if entry.bytes > 0 {
                write!(f, "  {}", human_bytes(entry.bytes))?;
            }
            writeln!(f)?;
        }
        for entry in &self.kept {
            writeln!(f, "  kept {}: {}", entry.path.display(), entry.why)?;
        }
        let total = human_bytes(self.bytes);
        let count = self.removed.len();
        match self.mode {
            RemoveMode::DryRun => writeln!(f, "dry run: {count} name(s), {total} would go"),
            RemoveMode::Remove => writeln!(f, "{count} name(s) removed, {total} freed"),
        }?;
        if !self.kept.is_empty() {
            writeln!(f, "{} name(s) kept", self.kept.len())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn removal(mode: RemoveMode) -> CacheRemoval {
        CacheRemoval {
            root: PathBuf::from("/c"),
            mode,
            removed: vec![
                RemovedEntry {
                    path: PathBuf::from("/c/models--o--m/blobs/ab"),
                    kind: CacheEntryKind::Blob,
                    bytes: 2048,
                },
                RemovedEntry {
                    path: PathBuf::from("/c/models--o--m/snapshots/c/x"),
                    kind: CacheEntryKind::Link,
                    bytes: 0,
                },
            ],
            bytes: 2048,
            kept: vec![KeptEntry {
                path: PathBuf::from("/c/models--o--m/blobs/cd"),
                why: KeepReason::OtherOwner { owner: 65534 },
            }],
        }
    }

    #[test]
    fn a_removal_says_each_name_its_bytes_and_what_was_kept_and_why() {
        let text = removal(RemoveMode::Remove).to_string();
        assert_eq!(
            text,
            "hub cache: /c\n\
             \x20 removed blob /c/models--o--m/blobs/ab  2.00 KiB\n\
             \x20 removed link /c/models--o--m/snapshots/c/x\n\
             \x20 kept /c/models--o--m/blobs/cd: owned by uid 65534, not this user\n\
             2 name(s) removed, 2.00 KiB freed\n\
             1 name(s) kept\n"
        );
        let dry = removal(RemoveMode::DryRun).to_string();
        assert!(
            dry.contains("  would remove blob /c/models--o--m/blobs/ab"),
            "{dry}"
        );
        assert!(
            dry.contains("dry run: 2 name(s), 2.00 KiB would go"),
            "{dry}"
        );
        assert_eq!(KeepReason::Locked.as_str(), "locked");
    }

    #[cfg(feature = "serde")]
    #[test]
    fn a_removal_in_json_has_its_mode_kinds_and_reasons_as_codes() {
        let json = serde_json::to_value(removal(RemoveMode::DryRun)).unwrap();
        assert_eq!(json["mode"], "dry_run");
        assert_eq!(json["root"], "/c");
        assert_eq!(json["bytes"], 2048);
        assert_eq!(json["removed"][0]["kind"], "blob");
        assert_eq!(json["removed"][1]["path"], "/c/models--o--m/snapshots/c/x");
        let why = &json["kept"][0]["why"];
        assert_eq!(why["code"], "other_owner");
        assert_eq!(why["owner"], 65534);
        assert_eq!(why["text"], "owned by uid 65534, not this user");
    }
}
