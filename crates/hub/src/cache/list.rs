//! What the hub cache holds, listed for `safeload cache` and [`hub_cache`]: its repositories, their snapshots' files and the blobs they link to, refs, temporary files; read without following a link the layout has none for.

use std::path::Path;

use super::hub::read_small;
use super::layout::{self, SHARED_STORE_MARKER};
use crate::os::{Dir, EntryKind};
use crate::report::{CacheListing, CachedFile, CachedRepo, CachedRevision};

/// Folders below a snapshot or `refs/` looked into at most.
pub(super) const MAX_DEPTH: usize = 16;

/// What the Hugging Face cache holds (feature `remote`): where it is, and for `repo`
/// (`org/name`; every model repository where `None`) its snapshots, their files and blobs,
/// refs and temporary files. A cache that cannot be read lists as empty.
///
/// ```
/// let listing = safeload::hub::hub_cache(Some("org/model"));
/// for repo in &listing.repos {
///     for revision in &repo.revisions {
///         let _ = (&revision.commit, &revision.refs, revision.files.len());
///     }
/// }
/// ```
pub fn hub_cache(repo: Option<&str>) -> CacheListing {
    let root = layout::hub_root(|name| std::env::var(name).ok());
    let mut listing = CacheListing {
        root: root.clone(),
        exists: false,
        repos: Vec::new(),
    };
    let Some(dir) = root.as_deref().and_then(|r| Dir::open(r).ok()) else {
        return listing;
    };
    listing.exists = true;
    let Ok(mut names) = dir.names() else {
        return listing;
    };
    names.sort();
    for name in names {
        let Some(id) = name.strip_prefix("models--") else {
            continue;
        };
        let id = id.replace("--", "/");
        if repo.is_some_and(|r| r != id) {
            continue;
        }
        if let Ok(repo_dir) = dir.sub(&name, false) {
            let repo_path = root.as_deref().unwrap_or(Path::new("")).join(&name);
            listing
                .repos
                .push(list_repo(id, &dir, &repo_dir, &repo_path));
        }
    }
    listing
}

fn list_repo(repo: String, root: &Dir, dir: &Dir, dir_path: &Path) -> CachedRepo {
    let mut listed = CachedRepo {
        repo,
        ..CachedRepo::default()
    };
    if let Ok(blobs) = dir.sub("blobs", false) {
        for name in blobs.names().unwrap_or_default() {
            if layout::is_temp_name(&name) {
                listed.incomplete += 1;
            } else if layout::named_digest(&name).is_none() {
                // Not a blob (`hf-hub`'s `<sha>.lock`, anything else): not counted.
                continue;
            } else if let Some(size) = blob_size(root, &blobs, &name) {
                listed.blobs += 1;
                listed.blob_bytes += size;
            }
        }
    }
    let refs = dir
        .sub("refs", false)
        .map_or_else(|_| Vec::new(), |d| refs_of(&d));
    let blobs = dir.sub("blobs", false).ok();
    if let Ok(snapshots) = dir.sub("snapshots", false) {
        let mut commits = snapshots.names().unwrap_or_default();
        commits.sort();
        for commit in commits.iter().filter(|c| layout::commit_name(c).is_some()) {
            let Ok(snapshot) = snapshots.sub(commit, false) else {
                continue;
            };
            let mut files = Vec::new();
            walk(&snapshot, "", 0, &mut |found| {
                files.push(snapshot_file(root, blobs.as_ref(), dir_path, found));
            });
            files.sort_by(|a, b| a.path.cmp(&b.path));
            let mut names: Vec<String> = refs
                .iter()
                .filter(|(c, _)| c == commit)
                .map(|(_, r)| r.clone())
                .collect();
            names.sort();
            listed.revisions.push(CachedRevision {
                commit: commit.clone(),
                refs: names,
                files,
            });
        }
    }
    listed
}

/// Each ref under `refs` (`main`, `refs/pr/1`) with the commit it names: `(commit, ref)`.
pub(super) fn refs_of(refs: &Dir) -> Vec<(String, String)> {
    let mut found = Vec::new();
    walk(refs, "", 0, &mut |f| {
        let commit = read_small(f.dir, f.name).and_then(|t| layout::commit_of_ref(&t));
        found.extend(commit.map(|commit| (commit, f.path.to_owned())));
    });
    found
}

/// An entry [`walk`] found: its folder, its path from the walk's start, and its name.
#[derive(Clone, Copy)]
pub(super) struct Found<'a> {
    pub dir: &'a Dir,
    pub path: &'a str,
    pub name: &'a str,
}

/// Calls `each` for every non-folder entry under `dir`, not following links.
pub(super) fn walk(dir: &Dir, prefix: &str, depth: usize, each: &mut dyn FnMut(Found)) {
    let mut names = dir.names().unwrap_or_default();
    names.sort();
    for name in names {
        let path = format!("{prefix}{name}");
        match dir.entry(&name) {
            Ok(EntryKind::Dir) if depth < MAX_DEPTH => {
                if let Ok(sub) = dir.sub(&name, false) {
                    walk(&sub, &format!("{path}/"), depth + 1, each);
                }
            }
            Ok(EntryKind::Dir) => {}
            Ok(_) => each(Found {
                dir,
                path: &path,
                name: &name,
            }),
            Err(_) => {}
        }
    }
}

/// A snapshot's file: the blob its link names, and that blob's size.
fn snapshot_file(root: &Dir, blobs: Option<&Dir>, repo_path: &Path, found: Found) -> CachedFile {
    let Found { dir, path, name } = found;
    let depth = path.matches('/').count();
    let mut file = CachedFile {
        path: path.to_owned(),
        ..CachedFile::default()
    };
    match dir.entry(name) {
        Ok(EntryKind::Link) => {
            let blob = dir
                .read_link(name)
                .ok()
                .and_then(|target| layout::blob_of_link(&target, depth, repo_path));
            if let (Some(blob), Some(blobs)) = (blob, blobs) {
                file.size = blob_size(root, blobs, &blob);
                file.blob = file.size.is_some().then_some(blob);
            }
        }
        Ok(EntryKind::File { len, .. }) => file.size = Some(len),
        _ => {}
    }
    file
}

/// The size of the blob `name` (a regular file, or the shared store entry it links to).
fn blob_size(root: &Dir, blobs: &Dir, name: &str) -> Option<u64> {
    match blobs.entry(name).ok()? {
        EntryKind::File { len, .. } => Some(len),
        EntryKind::Link => {
            let (prefix, hash) = layout::shared_blob_of_link(&blobs.read_link(name).ok()?)?;
            let store = root.sub("blobs", false).ok()?;
            store.entry(SHARED_STORE_MARKER).ok()?;
            match store.sub(&prefix, false).ok()?.entry(&hash).ok()? {
                EntryKind::File { len, .. } => Some(len),
                _ => None,
            }
        }
        _ => None,
    }
}
