//! The Hugging Face cache on disk: a repository's folder read (a revision's ref, a snapshot's files through their links to blobs, `.no_exist` markers) and written (a blob published, its snapshot link, the revision's ref), never following a name where the layout has none.
//!
//! Another user may have made any name here: a snapshot file is taken only as
//! a link of the layout's form to a blob of its repository (or a regular
//! file), directories are opened without following links, and a file is
//! published by a rename that never replaces.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::layout::{self, SHARED_STORE_MARKER};
use super::partial;
use super::temp::{self, nonce};
use super::write::{Target, TempFile};
use crate::os::{self, Dir, EntryKind};
use crate::source::{CacheStore, NotCached};

/// Refs, marker and lock files are a few bytes; more is not the layout.
const SMALL_FILE: u64 = 4096;

/// A file found in a cache, opened: its shown path, and the SHA-256 its blob's name vouches for.
pub(crate) struct Cached {
    pub path: PathBuf,
    pub file: File,
    pub sha256: Option<[u8; 32]>,
    /// A regular file in the snapshot (a cache without symlinks), not a named blob.
    pub plain: bool,
}

/// The SHA-256 a blob's name vouches for.
pub(crate) fn sha256_of_name(blob: &str) -> Option<[u8; 32]> {
    match layout::named_digest(blob)? {
        layout::Named::Sha256(digest) => Some(digest),
        layout::Named::GitBlob(_) => None,
    }
}

/// A repository's folder in the hub cache, as it is when looked at.
pub(crate) struct RepoView {
    root: Dir,
    dir: Dir,
    /// `<cache>/models--org--repo`, for the paths shown and absolute links.
    dir_path: PathBuf,
}

/// Reads a small regular file (not through a symlink) of `dir` whole.
pub(crate) fn read_small(dir: &Dir, name: &str) -> Option<String> {
    let file = dir.open_nofollow(name).ok()?;
    let mut text = String::new();
    file.take(SMALL_FILE).read_to_string(&mut text).ok()?;
    Some(text)
}

/// Walks `names` down from `dir` without following links, making folders where `create`.
fn walk(mut dir: Dir, names: &[&str], create: bool) -> io::Result<Dir> {
    for name in names {
        dir = dir.sub(name, create)?;
    }
    Ok(dir)
}

/// The commit `refs/<revision>` of the repository's folder `repo` holds.
pub(crate) fn ref_commit(repo: &Dir, revision: &str) -> Option<String> {
    let names = layout::names(revision)?;
    let (last, folders) = names.split_last()?;
    let refs = walk(repo.sub("refs", false).ok()?, folders, false).ok()?;
    layout::commit_of_ref(&read_small(&refs, last)?)
}

impl RepoView {
    /// The folder of `repo` in the cache at `root`, where it is one.
    pub(crate) fn open(root: &Path, repo: &str) -> Option<RepoView> {
        let folder = layout::repo_folder(repo);
        let root_dir = Dir::open(root).ok()?;
        let dir = root_dir.sub(&folder, false).ok()?;
        Some(RepoView {
            root: root_dir,
            dir,
            dir_path: root.join(folder),
        })
    }

    pub(crate) fn commit_of(&self, revision: &str) -> Option<String> {
        ref_commit(&self.dir, revision)
    }

    /// Whether `.no_exist/<commit>/<path>` marks `path` missing at `commit`.
    pub(crate) fn no_exist(&self, commit: &str, path: &str) -> bool {
        let Some(names) = layout::names(path) else {
            return false;
        };
        let Some((last, folders)) = names.split_last() else {
            return false;
        };
        let marks = self.dir.sub(".no_exist", false);
        let found = marks.and_then(|d| walk(d.sub(commit, false)?, folders, false)?.entry(last));
        matches!(found, Ok(EntryKind::File { .. }))
    }

    /// The file at `path` of the snapshot of `commit`, opened, and its shown path;
    /// `None` where it is missing or does not lead to a blob of this repository.
    pub(crate) fn file(&self, commit: &str, path: &str) -> Option<Cached> {
        let names = layout::names(path)?;
        let (last, folders) = names.split_last()?;
        let snapshots = self.dir.sub("snapshots", false).ok()?;
        let dir = walk(snapshots.sub(commit, false).ok()?, folders, false).ok()?;
        let (file, sha256, plain) = match dir.entry(last).ok()? {
            EntryKind::Link => {
                let target = dir.read_link(last).ok()?;
                let blob = layout::blob_of_link(&target, folders.len(), &self.dir_path)?;
                (self.blob(&blob)?, sha256_of_name(&blob), false)
            }
            // A cache written where symlinks are not supported holds the files.
            EntryKind::File { .. } => (dir.open_nofollow(last).ok()?, None, true),
            _ => return None,
        };
        Some(Cached {
            path: self.snapshot_path(commit, path),
            file,
            sha256,
            plain,
        })
    }

    pub(crate) fn snapshot_path(&self, commit: &str, path: &str) -> PathBuf {
        self.dir_path.join("snapshots").join(commit).join(path)
    }

    /// The blob `name`: a regular file, or a link into the shared store.
    pub(crate) fn blob(&self, name: &str) -> Option<File> {
        let blobs = self.dir.sub("blobs", false).ok()?;
        match blobs.entry(name).ok()? {
            EntryKind::File { .. } => blobs.open_nofollow(name).ok(),
            EntryKind::Link => {
                let target = blobs.read_link(name).ok()?;
                let (prefix, hash) = layout::shared_blob_of_link(&target)?;
                let store = self.root.sub("blobs", false).ok()?;
                // The store marks itself; an unmarked `blobs/` is no store.
                if read_small(&store, SHARED_STORE_MARKER)? != "1\n" {
                    return None;
                }
                store.sub(&prefix, false).ok()?.open_nofollow(&hash).ok()
            }
            _ => None,
        }
    }
}

/// Where a load writes into the hub cache: a repository at one commit.
pub(crate) struct RepoWriter {
    root: PathBuf,
    folder: String,
    commit: String,
    /// A branch or tag whose ref is written (`None` for a commit).
    revision: Option<String>,
    /// Paths to mark in `.no_exist/<commit>/` once the snapshot exists.
    no_exist: Vec<String>,
    /// Whether `blobs/` was swept of what dead writers left (once a load).
    swept: AtomicBool,
}

impl RepoWriter {
    /// The writer of `repo` at `commit`; `revision` is recorded in `refs/` unless a commit.
    pub(crate) fn new(
        root: &Path,
        repo: &str,
        commit: &str,
        revision: &str,
        no_exist: Vec<String>,
    ) -> RepoWriter {
        let revision = (layout::commit_name(revision).as_deref() != Some(commit)
            && layout::names(revision).is_some())
        .then(|| revision.to_owned());
        RepoWriter {
            root: root.to_path_buf(),
            folder: layout::repo_folder(repo),
            commit: commit.to_owned(),
            revision,
            no_exist,
            swept: AtomicBool::new(false),
        }
    }

    /// The cache's root, made where missing (the user's own choice: followed).
    fn root(&self) -> io::Result<Dir> {
        std::fs::create_dir_all(&self.root)?;
        Dir::open(&self.root)
    }

    fn repo(&self) -> io::Result<Dir> {
        self.root()?.sub(&self.folder, true)
    }

    /// Marks `path` missing at the commit (`.no_exist/<commit>/<path>`).
    pub(crate) fn mark_missing(&self, path: &str) -> io::Result<()> {
        let (dir, last, _) = self.folder_of(".no_exist", path)?;
        match dir.create_new(&last) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        }
    }

    /// The folder of `path` under `<top>/<commit>/` (made), its last name, and its depth.
    fn folder_of(&self, top: &str, path: &str) -> io::Result<(Dir, String, usize)> {
        let names = layout::names(path).ok_or_else(|| invalid("a path of the snapshot"))?;
        let (last, folders) = names.split_last().ok_or_else(|| invalid("an empty path"))?;
        let commit = self.repo()?.sub(top, true)?.sub(&self.commit, true)?;
        let dir = walk(commit, folders, true)?;
        Ok((dir, (*last).to_owned(), folders.len()))
    }

    pub(crate) fn snapshot_path(&self, path: &str) -> PathBuf {
        let snapshot = self.root.join(&self.folder).join("snapshots");
        snapshot.join(&self.commit).join(path)
    }

    fn blobs(&self, create: bool) -> io::Result<Dir> {
        self.repo()?.sub("blobs", create)
    }

    /// The repository's folder of locks, made where missing.
    fn locks(&self) -> io::Result<Dir> {
        self.root()?.sub(".locks", true)?.sub(&self.folder, true)
    }

    /// Links `snapshots/<commit>/<path>` to the blob, replacing any entry by a rename.
    pub(crate) fn link(&self, path: &str, blob: &str) -> io::Result<()> {
        let (dir, last, depth) = self.folder_of("snapshots", path)?;
        let last = last.as_str();
        let target = layout::snapshot_link(depth, blob);
        if dir.entry(last)? == EntryKind::Link
            && dir.read_link(last)?.to_str() == Some(target.as_str())
        {
            return Ok(());
        }
        let temp = layout::temp_name(last, nonce());
        dir.symlink(&target, &temp)?;
        dir.replace(&temp, last).inspect_err(|_| {
            let _ = dir.remove(&temp);
        })
    }

    /// Records `refs/<revision>` and the `.no_exist` markers, after a snapshot
    /// link: every ref names a snapshot there is.
    pub(crate) fn record(&self) -> io::Result<()> {
        let repo = self.repo()?;
        for path in &self.no_exist {
            self.mark_missing(path)?;
        }
        let Some(revision) = &self.revision else {
            return Ok(());
        };
        let names = layout::names(revision).ok_or_else(|| invalid("a revision"))?;
        let (last, folders) = names.split_last().ok_or_else(|| invalid("a revision"))?;
        let refs = walk(repo.sub("refs", true)?, folders, true)?;
        if read_small(&refs, last)
            .and_then(|t| layout::commit_of_ref(&t))
            .as_deref()
            == Some(self.commit.as_str())
        {
            return Ok(());
        }
        // Renamed into place: a reader sees the old ref or the new one.
        let temp = layout::temp_name(last, nonce());
        let file = refs.create_new(&temp)?;
        let written = os::write_all_at(&file, self.commit.as_bytes(), 0);
        drop(file);
        written
            .and_then(|()| refs.replace(&temp, last))
            .inspect_err(|_| {
                let _ = refs.remove(&temp);
            })
    }
}

fn invalid(what: &str) -> io::Error {
    let text = format!("not {what} of the cache");
    io::Error::new(io::ErrorKind::InvalidInput, text)
}

/// One file of a repository written to the hub cache: its blob and snapshot path.
pub(crate) struct HubTarget {
    pub writer: Arc<RepoWriter>,
    pub blob: String,
    pub path: String,
}

impl Target for HubTarget {
    fn store(&self) -> CacheStore {
        CacheStore::Hub
    }

    fn shown(&self) -> std::path::PathBuf {
        self.writer.snapshot_path(&self.path)
    }

    fn begin(&self, len: u64) -> Result<TempFile, NotCached> {
        let blobs = self.writer.blobs(true).map_err(|e| NotCached::of_io(&e))?;
        let locks = self.writer.locks().ok();
        let first = !self.writer.swept.swap(true, Ordering::Relaxed);
        if let Some(locks) = locks.as_ref().filter(|_| first) {
            temp::sweep(&blobs, locks);
        }
        TempFile::make(blobs, &self.blob, len, locks)
    }

    fn published(&self, len: u64) -> Option<File> {
        let blobs = self.writer.blobs(false).ok()?;
        let file = blobs.open_nofollow(&self.blob).ok()?;
        if file.metadata().ok()?.len() != len {
            return None;
        }
        self.writer.link(&self.path, &self.blob).ok()?;
        self.writer.record().ok()?;
        Some(file)
    }

    fn activity(&self) -> partial::Activity {
        match self.writer.blobs(false) {
            Ok(blobs) => partial::activity(&blobs, &self.blob),
            Err(_) => partial::Activity::default(),
        }
    }

    fn publish(&self, begun: &TempFile) -> io::Result<bool> {
        let published = begun.dir.rename_noreplace(&begun.temp, &self.blob)?;
        begun.moved.store(published, Ordering::Relaxed);
        if !published {
            // Another process's blob: linked only where it is a regular file
            // of this length (its name is its digest).
            let len = begun.file.metadata()?.len();
            match begun.dir.entry(&self.blob)? {
                EntryKind::File { len: theirs, .. } if theirs == len => {}
                _ => return Ok(false),
            }
        }
        self.writer.link(&self.path, &self.blob)?;
        self.writer.record()?;
        Ok(published)
    }
}
