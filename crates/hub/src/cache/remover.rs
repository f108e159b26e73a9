//! The removal of names of the hub cache, one at a time, for `clean.rs`: owned by this user (by `lstat`), a blob's lock free and held while it goes, a folder after all it holds, nothing followed; a dry run walks the same steps and removes nothing.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::layout;
use crate::coord::{Lock, Place};
use crate::error::{Error, Operation, Result};
use crate::os::{self, Dir, EntryKind};
use crate::report::{
    CacheEntryKind, CacheRemoval, KeepReason, KeptEntry, RemoveMode, RemovedEntry,
};

use super::list::MAX_DEPTH;

/// The hub cache's directory, as the process's environment names it.
pub(super) fn root_of_process() -> Result<PathBuf> {
    layout::hub_root(|name| std::env::var(name).ok()).ok_or_else(|| {
        let what = "no hub cache: neither HF_HUB_CACHE, HF_HOME nor HOME is set";
        let e = io::Error::new(io::ErrorKind::NotFound, what);
        Error::io(Operation::Remove, "HF_HUB_CACHE", None, e)
    })
}

pub(super) fn not_found(path: PathBuf, what: &str) -> Error {
    let e = io::Error::new(io::ErrorKind::NotFound, what.to_owned());
    Error::io(Operation::Remove, path, None, e)
}

/// A repository's folder, opened without following a link, with its `.locks/` folder.
pub(super) struct RepoDir {
    pub(super) dir: Dir,
    /// `<cache>/models--org--repo`: the paths shown, and absolute links.
    pub(super) path: PathBuf,
    locks: Option<Dir>,
}

impl RepoDir {
    pub(super) fn open(root: &Dir, folder: &str, path: PathBuf) -> Result<RepoDir> {
        let dir = match root.entry(folder) {
            Ok(EntryKind::Dir) => root.sub(folder, false),
            Ok(EntryKind::Missing) => return Err(not_found(path, "not in the hub cache")),
            Ok(_) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a folder (a link is never followed)",
            )),
            Err(e) => Err(e),
        }
        .map_err(|e| Error::io(Operation::Remove, &path, None, e))?;
        let locks = root
            .sub(".locks", false)
            .and_then(|l| l.sub(folder, false))
            .ok();
        Ok(RepoDir { dir, path, locks })
    }

    pub(super) fn sub_path(&self, names: &[&str]) -> PathBuf {
        names.iter().fold(self.path.clone(), |p, n| p.join(n))
    }
}

/// What a folder being emptied holds: plain names, or the blobs and temporary files of
/// `blobs/`, each removed under its lock.
#[derive(Clone, Copy)]
pub(super) enum Holds<'a> {
    /// Files of this kind, links, folders.
    Files(CacheEntryKind),
    /// Blobs and temporary files, each removed under its lock.
    Blobs(&'a RepoDir),
}

/// The state of one housekeeping call: who this process is, when it began, what it did.
pub(super) struct Cleaner {
    uid: Option<u32>,
    pub(super) now: SystemTime,
    pub(super) done: CacheRemoval,
}

impl Cleaner {
    pub(super) fn new(root: PathBuf, mode: RemoveMode) -> Cleaner {
        Cleaner {
            uid: os::effective_uid(),
            now: SystemTime::now(),
            done: CacheRemoval {
                root,
                mode,
                ..CacheRemoval::default()
            },
        }
    }

    /// The cache of the process's environment, opened, which must exist.
    pub(super) fn of_process(mode: RemoveMode) -> Result<(Dir, Cleaner)> {
        let root_path = root_of_process()?;
        let root =
            Dir::open(&root_path).map_err(|e| Error::io(Operation::Remove, &root_path, None, e))?;
        Ok((root, Cleaner::new(root_path, mode)))
    }

    pub(super) fn removing(&self) -> bool {
        self.done.mode == RemoveMode::Remove
    }

    pub(super) fn keep(&mut self, path: PathBuf, why: KeepReason) {
        self.done.kept.push(KeptEntry { path, why });
    }

    pub(super) fn failed(&mut self, path: PathBuf, e: &io::Error) {
        let error = e.to_string();
        self.keep(path, KeepReason::Failed { error });
    }

    /// [`Cleaner::failed`], then `false`: nothing went.
    pub(super) fn fail(&mut self, path: PathBuf, e: &io::Error) -> bool {
        self.failed(path, e);
        false
    }

    /// Whether `name` of `dir` is this user's (by `lstat`); else kept, saying whose.
    pub(super) fn owned(&mut self, dir: &Dir, name: &str, path: &Path) -> bool {
        match dir.owner(name) {
            Ok(Some(owner)) if self.uid.is_some_and(|uid| uid != owner) => {
                self.keep(path.to_path_buf(), KeepReason::OtherOwner { owner });
                false
            }
            Ok(_) => true,
            Err(e) => self.fail(path.to_path_buf(), &e),
        }
    }

    /// Removes the file or link `name` of `dir`, known to be this user's (dry run: noted).
    fn unlink_owned(
        &mut self,
        dir: &Dir,
        name: &str,
        path: PathBuf,
        kind: CacheEntryKind,
        bytes: u64,
    ) -> bool {
        if self.removing() {
            if let Err(e) = dir.remove(name) {
                return self.fail(path, &e);
            }
        }
        self.done.bytes += bytes;
        self.done.removed.push(RemovedEntry { path, kind, bytes });
        true
    }

    /// Removes the file or link `name` of `dir` where it is this user's.
    pub(super) fn unlink(
        &mut self,
        dir: &Dir,
        name: &str,
        path: PathBuf,
        files: CacheEntryKind,
    ) -> bool {
        if !self.owned(dir, name, &path) {
            return false;
        }
        let (kind, bytes) = match dir.entry(name) {
            Ok(EntryKind::File { len, .. }) => (files, len),
            Ok(EntryKind::Missing) => return true,
            Ok(EntryKind::Link) => (CacheEntryKind::Link, 0),
            Ok(_) => (CacheEntryKind::File, 0),
            Err(e) => return self.fail(path, &e),
        };
        self.unlink_owned(dir, name, path, kind, bytes)
    }

    /// Removes the blob or temporary file `name` of `blobs/` where it is this user's and
    /// its lock is free, held while it goes.
    pub(super) fn unlink_blob(&mut self, repo: &RepoDir, blobs: &Dir, name: &str) -> bool {
        let path = repo.sub_path(&["blobs", name]);
        if !self.owned(blobs, name, &path) {
            return false;
        }
        let kind = match layout::is_temp_name(name) || is_old_temp_name(name) {
            true => CacheEntryKind::Incomplete,
            false => CacheEntryKind::Blob,
        };
        let bytes = match blobs.entry(name) {
            Ok(EntryKind::File { len, .. }) => len,
            Ok(EntryKind::Missing) => return true,
            Ok(_) => 0,
            Err(e) => return self.fail(path, &e),
        };
        let blob = name.split('.').next().unwrap_or(name);
        let _lock = match lock(repo, blob) {
            Ok(lock) => lock,
            Err(why) => {
                self.keep(path, why);
                return false;
            }
        };
        self.unlink_owned(blobs, name, path, kind, bytes)
    }

    /// Removes the folder `name` of `dir` and all it holds, the folder last where
    /// everything went; a link at `name` as a link.
    pub(super) fn remove_tree(
        &mut self,
        dir: &Dir,
        name: &str,
        path: PathBuf,
        depth: usize,
        holds: Holds<'_>,
    ) -> bool {
        match (dir.entry(name), holds) {
            (Ok(EntryKind::Dir), _) => {}
            // A link (or a file) where a folder should be: removed itself.
            (Ok(_), Holds::Files(kind)) => return self.unlink(dir, name, path, kind),
            (Ok(_), Holds::Blobs(_)) => return self.unlink(dir, name, path, CacheEntryKind::File),
            (Err(e), _) => return self.fail(path, &e),
        }
        if !self.owned(dir, name, &path) {
            return false;
        }
        let listed = dir.sub(name, false).and_then(|sub| {
            let mut names = sub.names()?;
            names.sort();
            Ok((sub, names))
        });
        let (sub, names) = match listed {
            Ok(listed) => listed,
            Err(e) => return self.fail(path, &e),
        };
        let mut all = true;
        for child in &names {
            let child_path = path.join(child);
            all &= match (sub.entry(child), holds) {
                (Ok(EntryKind::Dir), _) if depth + 1 >= MAX_DEPTH => {
                    let e = io::Error::other("folders nested too deep");
                    self.fail(child_path, &e)
                }
                (Ok(EntryKind::Dir), _) => {
                    let files = Holds::Files(CacheEntryKind::File);
                    self.remove_tree(&sub, child, child_path, depth + 1, files)
                }
                (Ok(_), Holds::Blobs(repo)) => self.unlink_blob(repo, &sub, child),
                (Ok(_), Holds::Files(kind)) => self.unlink(&sub, child, child_path, kind),
                (Err(e), _) => self.fail(child_path, &e),
            };
        }
        self.remove_folder(dir, name, path, all)
    }

    /// The folder `name` of `dir` removed once `all` it held went, else kept.
    pub(super) fn remove_folder(
        &mut self,
        dir: &Dir,
        name: &str,
        path: PathBuf,
        all: bool,
    ) -> bool {
        if !all {
            self.keep(path, KeepReason::HoldsKept);
            return false;
        }
        if self.removing() {
            if let Err(e) = dir.remove_dir(name) {
                return self.fail(path, &e);
            }
        }
        let kind = CacheEntryKind::Folder;
        self.done.removed.push(RemovedEntry {
            path,
            kind,
            bytes: 0,
        });
        true
    }
}

/// A temporary name of the hub client before it added a nonce: `<blob>.incomplete`.
pub(super) fn is_old_temp_name(name: &str) -> bool {
    name.strip_suffix(".incomplete")
        .is_some_and(|blob| layout::named_digest(blob).is_some())
}

/// The blob's lock, tried once: `Ok(None)` where there is no lock file, `Ok(Some)` held
/// until dropped.
fn lock(repo: &RepoDir, blob: &str) -> std::result::Result<Option<Lock>, KeepReason> {
    let name = layout::lock_name(blob);
    let Some(locks) = &repo.locks else {
        return Ok(None);
    };
    if matches!(locks.entry(&name), Ok(EntryKind::Missing)) {
        return Ok(None);
    }
    match Lock::take(Place::Shared(locks, &name), Duration::ZERO) {
        Ok(lock) => Ok(Some(lock)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(KeepReason::Locked),
        Err(e) => Err(KeepReason::Failed {
            error: format!("its lock: {e}"),
        }),
    }
}
