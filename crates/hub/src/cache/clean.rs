//! Housekeeping of the hub cache (`safeload cache rm|prune`): a revision or a whole repository removed, temporary files dead writers left and blobs no snapshot links to pruned, each also as a dry run; never through a link, never what another user owns or a live writer locks.

use std::collections::BTreeSet;
use std::io;
use std::path::Path;

use super::hub::ref_commit;
use super::layout;
use super::list::{MAX_DEPTH, refs_of};
use super::remover::{Cleaner, Holds, RepoDir, is_old_temp_name, not_found, root_of_process};
use super::temp::stale;
use crate::error::{Error, Operation, Result};
use crate::os::{Dir, EntryKind};
use crate::remote::url::{HUB_NAME_RULE, HUB_REVISION_RULE, hub_name_ok, hub_revision_ok};
use crate::report::{CacheEntryKind, CacheRemoval, KeepReason, RemoveMode};

/// Removes a revision of the hub cache's repository `repo` (`org/name`),
/// or, with `revision` `None`, the whole repository (feature `remote`).
///
/// A revision is a commit or a branch or tag the cache has a ref of. Its
/// snapshot, refs, `.no_exist/<commit>` and the blobs no other snapshot links
/// to go; a dry run removes nothing. What is kept is listed with why.
///
/// ```no_run
/// use safeload::hub::RemoveMode;
/// // What would go, then the removal: the same names and bytes.
/// let plan = safeload::hub::hub_cache_remove("org/model", Some("v1.0"), RemoveMode::DryRun)?;
/// println!("{plan}");
/// let done = safeload::hub::hub_cache_remove("org/model", Some("v1.0"), RemoveMode::Remove)?;
/// assert_eq!(plan.bytes, done.bytes);
/// # Ok::<(), safeload::Error>(())
/// ```
///
/// # Errors
///
/// A repository id or revision that is no name of the hub
/// ([`ErrorKind::BadAddress`](safeload_core::ErrorKind::BadAddress) on
/// `hf://repo@revision`), before anything is looked at; no cache, no such
/// repository or revision in it ([`Error::is_not_found`]); a snapshot that
/// cannot be read (nothing is removed then). Each names its path.
pub fn hub_cache_remove(
    repo: &str,
    revision: Option<&str>,
    mode: RemoveMode,
) -> Result<CacheRemoval> {
    check_repo(repo)?;
    if let Some(revision) = revision {
        check_revision(repo, revision)?;
    }
    let (root, mut clean) = Cleaner::of_process(mode)?;
    let folder = layout::repo_folder(repo);
    let path = clean.done.root.join(&folder);
    match revision {
        None => clean.remove_repo(&root, &folder)?,
        Some(revision) => {
            let repo = RepoDir::open(&root, &folder, path)?;
            clean.remove_revision(&repo, revision)?;
        }
    }
    Ok(clean.done)
}

/// Prunes the hub cache (feature `remote`), in `repo` (`org/name`) or in
/// every model repository: temporary files of dead writers and blobs no
/// snapshot links to. With [`RemoveMode::DryRun`](crate::report::RemoveMode::DryRun),
/// nothing is removed; what is kept is listed with why.
///
/// ```no_run
/// use safeload::hub::RemoveMode;
/// let plan = safeload::hub::hub_cache_prune(None, RemoveMode::DryRun)?;
/// for entry in &plan.removed {
///     println!("would remove {} ({} bytes)", entry.path.display(), entry.bytes);
/// }
/// # Ok::<(), safeload::Error>(())
/// ```
///
/// # Errors
///
/// A repository id that is no name of the hub
/// ([`ErrorKind::BadAddress`](safeload_core::ErrorKind::BadAddress) on
/// `hf://repo`); no `HF_HUB_CACHE`, `HF_HOME` or `HOME` to find the cache
/// by; a cache or repository folder that cannot be listed.
pub fn hub_cache_prune(repo: Option<&str>, mode: RemoveMode) -> Result<CacheRemoval> {
    if let Some(repo) = repo {
        check_repo(repo)?;
    }
    let mut clean = Cleaner::new(root_of_process()?, mode);
    let root = match Dir::open(&clean.done.root) {
        Ok(root) => root,
        // Nothing to prune yet.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(clean.done),
        Err(e) => return Err(Error::io(Operation::Remove, &clean.done.root, None, e)),
    };
    let folders = match repo {
        Some(repo) => vec![layout::repo_folder(repo)],
        None => {
            let names = root
                .names()
                .map_err(|e| Error::io(Operation::Remove, &clean.done.root, None, e))?;
            let mut folders: Vec<String> = names
                .into_iter()
                .filter(|n| n.starts_with("models--"))
                .collect();
            folders.sort();
            folders
        }
    };
    for folder in folders {
        let path = clean.done.root.join(&folder);
        match root.entry(&folder) {
            Ok(EntryKind::Dir) => clean.prune_repo(&RepoDir::open(&root, &folder, path)?),
            // Not a folder of the layout (a link, a file): nothing in it to prune.
            Ok(_) => {}
            Err(e) => return Err(Error::io(Operation::Remove, path, None, e)),
        }
    }
    Ok(clean.done)
}

/// `org/name` as `hf://{repo}` takes it: nothing outside the root can be named.
fn check_repo(repo: &str) -> Result<()> {
    let ok = repo
        .split_once('/')
        .is_some_and(|(org, name)| hub_name_ok(org) && hub_name_ok(name));
    if ok {
        return Ok(());
    }
    Err(Error::bad_address(format!("hf://{repo}"), HUB_NAME_RULE))
}

/// A revision as `hf://` takes one ([`hub_revision_ok`]).
fn check_revision(repo: &str, revision: &str) -> Result<()> {
    if hub_revision_ok(revision) {
        return Ok(());
    }
    let address = format!("hf://{repo}@{revision}");
    Err(Error::bad_address(address, HUB_REVISION_RULE))
}

impl Cleaner {
    /// Removes the repository's folder: refs first (no ref names a snapshot
    /// that is gone), then the rest; a link in its place as a link.
    fn remove_repo(&mut self, root: &Dir, folder: &str) -> Result<()> {
        let path = self.done.root.join(folder);
        match root.entry(folder) {
            Ok(EntryKind::Dir) => {}
            Ok(EntryKind::Missing) => return Err(not_found(path, "not in the hub cache")),
            Ok(_) => {
                self.unlink(root, folder, path, CacheEntryKind::File);
                return Ok(());
            }
            Err(e) => return Err(Error::io(Operation::Remove, path, None, e)),
        }
        if !self.owned(root, folder, &path) {
            return Ok(());
        }
        let repo = RepoDir::open(root, folder, path.clone())?;
        let mut names = repo
            .dir
            .names()
            .map_err(|e| Error::io(Operation::Remove, &path, None, e))?;
        // The hub's clients look at refs, then snapshots: those go first.
        names.sort();
        names.sort_by_key(|n| match n.as_str() {
            "refs" => 0,
            "snapshots" => 1,
            ".no_exist" => 2,
            _ => 3,
        });
        let mut all = true;
        for name in &names {
            let holds = match name.as_str() {
                "blobs" => Holds::Blobs(&repo),
                "refs" if repo.dir.entry(name).is_ok_and(|e| e == EntryKind::Dir) => {
                    Holds::Files(CacheEntryKind::Ref)
                }
                _ => Holds::Files(CacheEntryKind::File),
            };
            all &= self.remove_tree(&repo.dir, name, path.join(name), 0, holds);
        }
        self.remove_folder(root, folder, path, all);
        Ok(())
    }

    fn remove_revision(&mut self, repo: &RepoDir, revision: &str) -> Result<()> {
        let commit = match layout::commit_name(revision) {
            Some(commit) => commit,
            // `check_revision` made it plain names: its path is `refs/<revision>`.
            None => ref_commit(&repo.dir, revision).ok_or_else(|| {
                let path = repo.sub_path(&["refs", revision]);
                not_found(path, "no such ref in the hub cache")
            })?,
        };
        let snapshots_path = repo.sub_path(&["snapshots"]);
        let snapshots = open_optional(&repo.dir, "snapshots", &snapshots_path)?;
        let refs = open_optional(&repo.dir, "refs", &repo.sub_path(&["refs"]))?;
        let no_exist = open_optional(&repo.dir, ".no_exist", &repo.sub_path(&[".no_exist"]))?;
        let naming: Vec<String> = refs.as_ref().map_or_else(Vec::new, |refs| {
            let all = refs_of(refs).into_iter();
            all.filter(|(c, _)| *c == commit).map(|(_, r)| r).collect()
        });
        let is_there = |dir: &Option<Dir>| {
            dir.as_ref()
                .is_some_and(|d| !matches!(d.entry(&commit), Ok(EntryKind::Missing) | Err(_)))
        };
        let snapshot_path = snapshots_path.join(&commit);
        if naming.is_empty() && !is_there(&snapshots) && !is_there(&no_exist) {
            let what = "no such revision in the hub cache";
            return Err(not_found(snapshot_path, what));
        }
        let (own, others) = match &snapshots {
            Some(dir) => snapshot_blobs(dir, &commit, &repo.path)
                .map_err(|e| Error::io(Operation::Remove, &snapshots_path, None, e))?,
            None => Default::default(),
        };
        if let Some(refs) = &refs {
            for name in &naming {
                self.unlink_ref(repo, refs, name);
            }
        }
        let no_exist_path = repo.sub_path(&[".no_exist", &commit]);
        for (dir, path) in [(&snapshots, snapshot_path), (&no_exist, no_exist_path)] {
            if let Some(dir) = dir.as_ref().filter(|_| is_there(dir)) {
                let files = Holds::Files(CacheEntryKind::File);
                self.remove_tree(dir, &commit, path, 0, files);
            }
        }
        if let Ok(blobs) = repo.dir.sub("blobs", false) {
            for blob in own.difference(&others) {
                if matches!(
                    blobs.entry(blob),
                    Ok(EntryKind::File { .. } | EntryKind::Link)
                ) {
                    self.unlink_blob(repo, &blobs, blob);
                }
            }
        }
        Ok(())
    }

    /// Removes the ref at `name` (`main`, `refs/pr/1`) of `refs/`.
    fn unlink_ref(&mut self, repo: &RepoDir, refs: &Dir, name: &str) {
        let Some(names) = layout::names(name) else {
            return;
        };
        let Some((last, folders)) = names.split_last() else {
            return;
        };
        let path = repo.sub_path(&["refs", name]);
        let mut below: Option<Dir> = None;
        for folder in folders {
            match below.as_ref().unwrap_or(refs).sub(folder, false) {
                Ok(dir) => below = Some(dir),
                Err(e) => return self.failed(path, &e),
            }
        }
        let dir = below.as_ref().unwrap_or(refs);
        self.unlink(dir, last, path, CacheEntryKind::Ref);
    }

    fn prune_repo(&mut self, repo: &RepoDir) {
        let blobs = match repo.dir.sub("blobs", false) {
            Ok(blobs) => blobs,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return,
            Err(e) => return self.failed(repo.sub_path(&["blobs"]), &e),
        };
        let linked = match all_snapshot_blobs(repo) {
            Ok(linked) => Some(linked),
            Err(e) => {
                // Which blobs a snapshot links to is not known: every one kept.
                self.failed(repo.sub_path(&["snapshots"]), &e);
                None
            }
        };
        let mut names = match blobs.names() {
            Ok(names) => names,
            Err(e) => return self.failed(repo.sub_path(&["blobs"]), &e),
        };
        names.sort();
        for name in &names {
            if layout::is_temp_name(name) || is_old_temp_name(name) {
                let Ok(EntryKind::File { modified, .. }) = blobs.entry(name) else {
                    continue;
                };
                if stale(modified, self.now) {
                    self.unlink_blob(repo, &blobs, name);
                } else {
                    self.keep(repo.sub_path(&["blobs", name]), KeepReason::Recent);
                }
            } else if layout::named_digest(name).is_some()
                && linked.as_ref().is_some_and(|l| !l.contains(name))
            {
                self.unlink_blob(repo, &blobs, name);
            }
        }
    }
}

/// The folder `name` of `dir`, where there is one (a link there is an
/// error: never followed).
fn open_optional(dir: &Dir, name: &str, path: &Path) -> Result<Option<Dir>> {
    match dir.sub(name, false) {
        Ok(sub) => Ok(Some(sub)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(Operation::Remove, path, None, e)),
    }
}

/// The blobs the links under `dir` lead to, added to `into`; a link of an
/// unknown form counts too (keeping a blob is the safe mistake). An
/// unreadable folder is an error: the set would not be whole.
fn linked_blobs(
    dir: &Dir,
    depth: usize,
    repo_path: &Path,
    into: &mut BTreeSet<String>,
) -> io::Result<()> {
    for name in dir.names()? {
        match dir.entry(&name)? {
            EntryKind::Dir if depth + 1 < MAX_DEPTH => {
                linked_blobs(&dir.sub(&name, false)?, depth + 1, repo_path, into)?;
            }
            EntryKind::Dir => return Err(io::Error::other("snapshot folders nested too deep")),
            EntryKind::Link => {
                let target = dir.read_link(&name)?;
                let blob = layout::blob_of_link(&target, depth, repo_path).or_else(|| {
                    // A link of another form (absolute through another path to the
                    // cache, a level off): taken by its last names, so that what it
                    // may lead to is kept.
                    let blob = target.file_name()?.to_str()?;
                    let folder = target.parent()?.file_name()?;
                    (folder == "blobs" && layout::named_digest(blob).is_some())
                        .then(|| blob.to_owned())
                });
                into.extend(blob);
            }
            _ => {}
        }
    }
    Ok(())
}

/// The blobs the snapshot of `commit` links to, and those every other
/// snapshot links to.
fn snapshot_blobs(
    snapshots: &Dir,
    commit: &str,
    repo_path: &Path,
) -> io::Result<(BTreeSet<String>, BTreeSet<String>)> {
    let mut own = BTreeSet::new();
    let mut others = BTreeSet::new();
    for name in snapshots.names()? {
        // A snapshot that is a link is not followed: it links to no blob here.
        if snapshots.entry(&name)? != EntryKind::Dir {
            continue;
        }
        let into = if name == commit {
            &mut own
        } else {
            &mut others
        };
        linked_blobs(&snapshots.sub(&name, false)?, 0, repo_path, into)?;
    }
    Ok((own, others))
}

fn all_snapshot_blobs(repo: &RepoDir) -> io::Result<BTreeSet<String>> {
    match repo.dir.sub("snapshots", false) {
        Ok(snapshots) => snapshot_blobs(&snapshots, "", &repo.path).map(|(_, all)| all),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(BTreeSet::new()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::remote::url::RemoteUrl;
    use std::path::PathBuf;

    #[test]
    fn names_the_hub_would_refuse_are_refused_before_anything_is_looked_at() {
        for good in ["org/model", "a/b", "Org-1/m.v2_x"] {
            assert!(check_repo(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "org",
            "org/",
            "/model",
            "../x",
            "org/..",
            "org/../../etc",
            "org/a/b",
            "org--x/m",
            "org/m--x",
            ".org/m",
            "org/m.",
            "org/m\0",
            "org\\m/x",
        ] {
            let e = check_repo(bad).unwrap_err();
            assert!(
                matches!(e.kind(), ErrorKind::BadAddress { .. }),
                "{bad}: {e}"
            );
            let address = format!("hf://{bad}");
            assert_eq!(e.path(), Some(std::path::Path::new(&address)));
            // The rule of addresses: none names this repository.
            let named = matches!(RemoteUrl::parse(&address), Ok(RemoteUrl::Hub { repo, .. }) if repo == bad);
            assert!(!named, "{address}");
        }
        for good in ["main", "v1.0", "refs/pr/1", &"ab".repeat(20)] {
            assert!(check_revision("o/m", good).is_ok(), "{good}");
            let escaped = good.replace('/', "%2F");
            assert!(RemoteUrl::parse(&format!("hf://o/m@{escaped}")).is_ok());
        }
        for bad in [
            "",
            "..",
            "../main",
            "refs/../../x",
            "a//b",
            "/main",
            "main/",
            "a%2Fb",
            "a@b",
        ] {
            let e = check_revision("o/m", bad).unwrap_err();
            assert!(
                matches!(e.kind(), ErrorKind::BadAddress { .. }),
                "{bad}: {e}"
            );
            let address = format!("hf://o/m@{bad}");
            assert_eq!(e.path(), Some(std::path::Path::new(&address)));
            // Refused as an address too (`%2F` is how an address writes a `/`).
            let escaped = format!("hf://o/m@{}", bad.replace('/', "%2F"));
            assert!(
                bad.contains('%') || RemoteUrl::parse(&escaped).is_err(),
                "{escaped}"
            );
        }
    }

    #[cfg(unix)]
    #[test]
    fn the_blobs_one_snapshot_links_to_are_told_from_those_of_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("models--o--m");
        let (a, b) = ("a".repeat(40), "b".repeat(40));
        let snapshot = |c: &str| repo.join("snapshots").join(c);
        std::fs::create_dir_all(snapshot(&a).join("sub")).unwrap();
        std::fs::create_dir_all(snapshot(&b)).unwrap();
        let blob = |c: &str| c.repeat(64);
        let link = |target: String, at: PathBuf| std::os::unix::fs::symlink(target, at).unwrap();
        link(format!("../../blobs/{}", blob("1")), snapshot(&a).join("x"));
        link(
            format!("../../../blobs/{}", blob("2")),
            snapshot(&a).join("sub/y"),
        );
        link(format!("../../blobs/{}", blob("2")), snapshot(&b).join("y"));
        link("/etc/passwd".to_owned(), snapshot(&b).join("evil"));
        // Absolute, through another path to the cache: kept on the safe side.
        let elsewhere = format!("/elsewhere/models--o--m/blobs/{}", blob("3"));
        link(elsewhere, snapshot(&b).join("z"));
        let snapshots = Dir::open(&repo.join("snapshots")).unwrap();
        let (own, others) = snapshot_blobs(&snapshots, &a, &repo).unwrap();
        assert_eq!(own, BTreeSet::from([blob("1"), blob("2")]));
        assert_eq!(others, BTreeSet::from([blob("2"), blob("3")]));
    }

    #[test]
    fn old_temporary_names_are_a_blobs_name_and_incomplete() {
        let blob = "ab".repeat(32);
        assert!(is_old_temp_name(&format!("{blob}.incomplete")));
        assert!(!is_old_temp_name("x.incomplete"));
        assert!(!is_old_temp_name(&blob));
    }
}
