//! Remote checkpoints through a cache (feature `remote`): `hf://` through the Hugging Face cache in its own layout, other stores through a cache directory of this crate's; each file read from the cache where it holds it, else fetched and written to it as the load reads it, every file of a load at one commit.
//!
//! `hf://org/repo@rev`: the commit is `rev` where it is one, else the cache's
//! `refs/<rev>` offline (or where the hub cannot be reached), else what one
//! HEAD of `model.safetensors` names; each file then comes from the snapshot,
//! else is fetched at that commit and written through (`write.rs`).

mod check;
mod clean;
mod extra;
mod extras;
mod heartbeat;
mod hits;
mod hub;
pub(crate) mod layout;
mod list;
mod partial;
mod remover;
mod source;
mod store;
mod streams;
mod temp;
mod write;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::cancel::Cancel;
use crate::error::{Error, Operation, RemoteFailure, Result};
use crate::format::{INDEX_FILE, SINGLE_FILE};
use crate::mount::MountTable;
use crate::remote::checkpoint::{Found, RemoteCheckpoint};
use crate::remote::hub::HubFileMeta;
use crate::remote::location::HubLookup;
use crate::remote::object::RemoteObject;
use crate::remote::url::RemoteUrl;
use crate::source::{NotCached, Source};

use check::Check;
pub use clean::{hub_cache_prune, hub_cache_remove};
pub use extras::RemoteExtras;
use hits::{HitOf, blob_name, hit_of, read_index};
use hub::{Cached, HubTarget, RepoView, RepoWriter};
pub use list::hub_cache;
use source::Fetched;
use store::StoreCache;
use write::Target;

/// What the environment says of the caches, read once per load.
#[derive(Debug, Clone)]
struct CacheEnv {
    hub_root: Option<PathBuf>,
    offline: bool,
    hub_on: bool,
    store_dir: Option<PathBuf>,
    verify: bool,
    cancel: Cancel,
}

impl CacheEnv {
    fn from_process(
        hub: Option<bool>,
        dir: Option<&Path>,
        verify: bool,
        cancel: &Cancel,
    ) -> CacheEnv {
        let var = |name: &str| std::env::var(name).ok();
        CacheEnv {
            hub_root: layout::hub_root(var),
            offline: layout::offline(var),
            hub_on: layout::hub_cache_on(hub, var),
            store_dir: layout::store_cache_dir(dir, var),
            verify,
            cancel: cancel.clone(),
        }
    }
}

/// A remote checkpoint seen through its cache.
pub(crate) struct Remote {
    checkpoint: RemoteCheckpoint,
    mode: Mode,
    /// Files found in the cache, opened, until the open path takes them.
    hits: Mutex<HashMap<String, Cached>>,
    /// The files brought by `?with=`: each one's snapshot path, `None`
    /// where the repository has none at the commit.
    extra: BTreeMap<String, Option<PathBuf>>,
}

enum Mode {
    Off,
    Hub(HubMode),
    Directory(StoreCache),
}

struct HubMode {
    view: Option<RepoView>,
    writer: Option<Arc<RepoWriter>>,
    commit: String,
    /// The subfolder's path with its `/`, or empty.
    prefix: String,
    /// No request may be sent: what the cache lacks is an error.
    offline: bool,
    /// The load checks digests (see [`Remote::with_digest`]).
    verify: bool,
}

/// What the hub said of `model.safetensors` at the commit, if it was asked.
enum SingleFile {
    Unknown,
    Exists(HubFileMeta),
    Missing,
}

/// Resolves `text` through its cache: `hub` and `dir` are the caller's
/// choices over the environment's.
pub(crate) fn resolve(
    text: &str,
    hub: Option<bool>,
    dir: Option<&Path>,
    verify: bool,
    cancel: &Cancel,
) -> Result<(Remote, Found)> {
    let env = CacheEnv::from_process(hub, dir, verify, cancel);
    match RemoteUrl::parse(text) {
        Ok(RemoteUrl::Hub {
            repo,
            revision,
            subfolder,
            with,
        }) if env.hub_on => {
            let (mut remote, found) =
                resolve_hub(text, &repo, revision.as_deref(), &subfolder, &env)?;
            remote.extra = remote.bring(&with)?;
            Ok((remote, found))
        }
        Ok(RemoteUrl::Hub { with, .. }) if !with.is_empty() => Err(Error::remote_failed(
            Operation::Open,
            text,
            None,
            RemoteFailure::Unsupported,
            "?with= brings files into the hub cache, which is off \
             (Loader::hub_cache(false), SAFELOAD_HUB_CACHE=0)",
        )),
        Ok(RemoteUrl::Store { .. } | RemoteUrl::Http { .. }) if env.store_dir.is_some() => {
            let (checkpoint, found) = RemoteCheckpoint::resolve(text, &env.cancel)?;
            let store = StoreCache::new(env.store_dir.unwrap_or_default());
            Ok((Remote::new(checkpoint, Mode::Directory(store)), found))
        }
        _ => {
            let (checkpoint, found) = RemoteCheckpoint::resolve(text, &env.cancel)?;
            Ok((Remote::new(checkpoint, Mode::Off), found))
        }
    }
}

/// `hf://{repo}@{commit}[/{subfolder}]`.
fn at_commit(repo: &str, commit: &str, subfolder: &str) -> String {
    if subfolder.is_empty() {
        format!("hf://{repo}@{commit}")
    } else {
        format!("hf://{repo}@{commit}/{subfolder}")
    }
}

fn not_in_cache(shown: impl Into<PathBuf>, what: &str) -> Error {
    let failure = RemoteFailure::OfflineNotCached;
    Error::remote_failed(Operation::Open, shown, None, failure, what)
}

struct HubAddress<'a> {
    text: &'a str,
    repo: &'a str,
    rev: &'a str,
    subfolder: &'a str,
    cancel: &'a Cancel,
}

impl HubAddress<'_> {
    fn at(&self, commit: &str) -> Result<RemoteCheckpoint> {
        RemoteCheckpoint::new(&at_commit(self.repo, commit, self.subfolder), self.cancel)
    }
}

/// Where a hub address's commit came from.
struct Resolved {
    commit: String,
    checkpoint: RemoteCheckpoint,
    /// What the hub said of `model.safetensors`, where it was asked.
    single: SingleFile,
    /// No request may be sent (asked, or the hub could not be reached).
    offline: bool,
}

fn resolve_hub(
    text: &str,
    repo: &str,
    revision: Option<&str>,
    subfolder: &str,
    env: &CacheEnv,
) -> Result<(Remote, Found)> {
    let address = HubAddress {
        text,
        repo,
        rev: revision.unwrap_or("main"),
        subfolder,
        cancel: &env.cancel,
    };
    let view = env
        .hub_root
        .as_deref()
        .and_then(|root| RepoView::open(root, repo));
    let resolved = resolve_commit(&address, view.as_ref(), env.offline)?;
    let prefix = if subfolder.is_empty() {
        String::new()
    } else {
        format!("{subfolder}/")
    };
    let no_exist = match resolved.single {
        SingleFile::Missing => vec![format!("{prefix}{SINGLE_FILE}")],
        _ => Vec::new(),
    };
    let commit = resolved.commit;
    let writer = env
        .hub_root
        .as_deref()
        .map(|root| Arc::new(RepoWriter::new(root, repo, &commit, address.rev, no_exist)));
    let mode = Mode::Hub(HubMode {
        view,
        writer,
        commit,
        prefix,
        offline: resolved.offline,
        verify: env.verify,
    });
    let remote = Remote::new(resolved.checkpoint, mode);
    let found = remote.find_hub(resolved.single)?;
    Ok((remote, found))
}

/// The commit of a hub address: the revision where it is one; offline, the
/// cache's ref; else the hub's answer (the ref where it cannot be reached).
fn resolve_commit(
    address: &HubAddress<'_>,
    view: Option<&RepoView>,
    offline: bool,
) -> Result<Resolved> {
    let cached_commit = || view.and_then(|v| v.commit_of(address.rev));
    let resolved = |commit: String, single, offline| -> Result<Resolved> {
        let checkpoint = address.at(&commit)?;
        Ok(Resolved {
            commit,
            checkpoint,
            single,
            offline,
        })
    };
    if let Some(commit) = layout::commit_name(address.rev) {
        return resolved(commit, SingleFile::Unknown, offline);
    }
    if offline {
        let Some(commit) = cached_commit() else {
            let what = format!("no refs/{} for {}", address.rev, address.repo);
            return Err(not_in_cache(address.text, &what));
        };
        return resolved(commit, SingleFile::Unknown, true);
    }
    let checkpoint = RemoteCheckpoint::new(address.text, address.cancel)?;
    match lookup_single(&checkpoint)? {
        Some(Ok((commit, meta))) => {
            let Some(commit) = layout::commit_name(&commit) else {
                let detail = "the hub's answer names no commit";
                let protocol = RemoteFailure::Protocol;
                let e = Error::remote_failed(Operation::Open, address.text, None, protocol, detail);
                return Err(e);
            };
            Ok(Resolved {
                commit,
                checkpoint,
                single: meta.map_or(SingleFile::Missing, SingleFile::Exists),
                offline,
            })
        }
        // The hub cannot be reached: the cache's ref, as the hub's client does.
        Some(Err(e)) if e.kind.unreached() && cached_commit().is_some() => resolved(
            cached_commit().unwrap_or_default(),
            SingleFile::Unknown,
            true,
        ),
        Some(Err(e)) => Err(e.into_error(Operation::Open)),
        None => Err(not_in_cache(address.text, "not a hub address")),
    }
}

/// What the hub says of `model.safetensors`, and the commit; where its 404
/// names no commit (a mirror's), the index's answer names it.
fn lookup_single(checkpoint: &RemoteCheckpoint) -> Result<HubLookup> {
    let location = checkpoint.location();
    let looked = location.hub_lookup(SINGLE_FILE);
    let Some(Ok((commit, None))) = &looked else {
        return Ok(looked);
    };
    if !commit.is_empty() {
        return Ok(looked);
    }
    match location.hub_lookup(INDEX_FILE) {
        Some(Ok((commit, Some(_)))) => Ok(Some(Ok((commit, None)))),
        Some(Ok((_, None))) => Err(checkpoint.no_checkpoint()),
        other => Ok(other),
    }
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match &self.mode {
            Mode::Off => "off",
            Mode::Hub(_) => "hub cache",
            Mode::Directory(_) => "cache directory",
        };
        f.debug_struct("Remote")
            .field("checkpoint", &self.checkpoint)
            .field("cache", &mode)
            .finish_non_exhaustive()
    }
}

impl Remote {
    fn new(checkpoint: RemoteCheckpoint, mode: Mode) -> Remote {
        Remote {
            checkpoint,
            mode,
            hits: Mutex::new(HashMap::new()),
            extra: BTreeMap::new(),
        }
    }

    fn hits(&self) -> std::sync::MutexGuard<'_, HashMap<String, Cached>> {
        self.hits.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the hub cache holds `name` at the commit (opened and kept
    /// the first time it is asked).
    fn in_cache(&self, name: &str) -> bool {
        let Mode::Hub(hub) = &self.mode else {
            return false;
        };
        if self.hits().contains_key(name) {
            return true;
        }
        let Some(view) = &hub.view else {
            return false;
        };
        match view.file(&hub.commit, &format!("{}{name}", hub.prefix)) {
            Some(found) => {
                self.hits().insert(name.to_owned(), found);
                true
            }
            None => false,
        }
    }

    /// The checkpoint at the pinned commit: `model.safetensors`, else the index.
    fn find_hub(&self, single: SingleFile) -> Result<Found> {
        let Mode::Hub(hub) = &self.mode else {
            return self.checkpoint.find();
        };
        let single_found = |meta: HubFileMeta| -> Result<Found> {
            if !self.in_cache(SINGLE_FILE) {
                let object = self
                    .checkpoint
                    .location()
                    .open_known(SINGLE_FILE, meta)
                    .map_err(|e| e.into_error(Operation::Open))?;
                self.checkpoint.keep(SINGLE_FILE, Arc::new(object));
            }
            Ok(Found::Single(SINGLE_FILE.to_owned()))
        };
        match single {
            SingleFile::Exists(meta) => single_found(meta),
            SingleFile::Missing => self.index(),
            SingleFile::Unknown => {
                let marked = hub.view.as_ref().is_some_and(|v| {
                    v.no_exist(&hub.commit, &format!("{}{SINGLE_FILE}", hub.prefix))
                });
                if self.in_cache(SINGLE_FILE) {
                    Ok(Found::Single(SINGLE_FILE.to_owned()))
                } else if marked || self.in_cache(INDEX_FILE) {
                    self.index()
                } else if hub.offline {
                    let what = format!("neither {SINGLE_FILE} nor {INDEX_FILE} at {}", hub.commit);
                    Err(not_in_cache(self.checkpoint.shown(SINGLE_FILE), &what))
                } else {
                    match self.checkpoint.location().hub_lookup(SINGLE_FILE) {
                        Some(Ok((_, Some(meta)))) => single_found(meta),
                        Some(Ok((_, None))) => self.index(),
                        Some(Err(e)) => Err(e.into_error(Operation::Open)),
                        None => self.checkpoint.find(),
                    }
                }
            }
        }
    }

    /// The index: from the cache, else fetched and written to it.
    fn index(&self) -> Result<Found> {
        let found = self
            .in_cache(INDEX_FILE)
            .then(|| self.hits().remove(INDEX_FILE));
        if let Some(cached) = found.flatten() {
            let bytes = read_index(&cached.path, &cached.file)?;
            return Ok(Found::Index(INDEX_FILE.to_owned(), bytes));
        }
        self.online(INDEX_FILE)?;
        let (bytes, object) = match self.checkpoint.read_index(INDEX_FILE) {
            Ok(read) => read,
            Err(e) if e.is_not_found() => return Err(self.checkpoint.no_checkpoint()),
            Err(e) => return Err(e),
        };
        self.write_small(&object, INDEX_FILE, &bytes)?;
        Ok(Found::Index(INDEX_FILE.to_owned(), bytes))
    }

    /// An error for `name` where the hub cache is offline: it lacks the file.
    fn online(&self, name: &str) -> Result<()> {
        match &self.mode {
            Mode::Hub(hub) if hub.offline => {
                let what = format!("{name} at {}", hub.commit);
                Err(not_in_cache(self.checkpoint.shown(name), &what))
            }
            _ => Ok(()),
        }
    }

    /// Writes the small file `name` (`bytes`) to the hub cache and checks it before the
    /// load goes on (a mismatch is an error): whether it was written.
    fn write_small(&self, object: &RemoteObject, name: &str, bytes: &[u8]) -> Result<bool> {
        use crate::source::CacheWrite;
        let Some((target, check)) = self.hub_target(object, name) else {
            return Ok(false);
        };
        let len = object.len();
        let write = write::Write::of(target, len, check, 0, object.cancel().clone());
        write.write_image(bytes);
        write.settle();
        let outcome = write.outcome().checked(object.path())?;
        Ok(matches!(outcome, crate::source::CacheUse::Written { .. }))
    }

    /// Where `name` goes in the hub cache, and how it is checked.
    fn hub_target(
        &self,
        object: &RemoteObject,
        name: &str,
    ) -> Option<(Box<dyn Target>, std::result::Result<Check, NotCached>)> {
        let Mode::Hub(hub) = &self.mode else {
            return None;
        };
        let writer = hub.writer.as_ref()?;
        let etag = blob_name(object);
        let check = layout::named_digest(&etag)
            .map(Check::Digest)
            .ok_or(NotCached::NoDigest);
        let target = HubTarget {
            writer: Arc::clone(writer),
            blob: etag,
            path: format!("{}{name}", hub.prefix),
        };
        Some((Box::new(target), check))
    }

    /// What `name` is shown by: its snapshot path, else its address.
    pub(crate) fn shown(&self, name: &str) -> PathBuf {
        if self.in_cache(name) {
            if let Some(cached) = self.hits().get(name) {
                return cached.path.clone();
            }
        }
        PathBuf::from(self.checkpoint.shown(name))
    }

    /// `name` as a source: from the cache, else fetched (written through).
    pub(crate) fn take(&self, name: &str, table: Option<&MountTable>) -> Result<Arc<dyn Source>> {
        let hit = self.hits().remove(name);
        if let (Some(cached), Mode::Hub(hub)) = (hit, &self.mode) {
            let cached = self.with_digest(name, cached)?;
            return hit_of(cached, table, HitOf::Hub(&hub.commit));
        }
        self.online(name)?;
        let object = self.checkpoint.take(name)?;
        match &self.mode {
            Mode::Off => Ok(object),
            Mode::Hub(hub) => {
                if let Some(cached) = self.blob_of(hub, &object, name) {
                    return hit_of(cached, table, HitOf::Hub(&hub.commit));
                }
                match self.hub_target(&object, name) {
                    Some((target, check)) => Ok(Arc::new(Fetched::new(object, target, check))),
                    None => Ok(object),
                }
            }
            Mode::Directory(store) => {
                let address = object.path().to_string_lossy().into_owned();
                let len = object.len();
                let etag = object.etag().map(str::to_owned);
                if let Some((path, file)) =
                    etag.as_ref().and_then(|e| store.lookup(&address, len, e))
                {
                    let cached = Cached {
                        path,
                        file,
                        sha256: None,
                        plain: false,
                    };
                    return hit_of(cached, table, HitOf::Directory(etag.unwrap_or_default()));
                }
                let target = Box::new(store.target(&address, len, etag.as_deref().unwrap_or("")));
                let check = etag.map(|_| Check::Whole).ok_or(NotCached::NoDigest);
                Ok(Arc::new(Fetched::new(object, target, check)))
            }
        }
    }
}
