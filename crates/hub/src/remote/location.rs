//! Where a remote checkpoint's files are: the client, the prefix, each file opened as a [`RemoteObject`]; for `hf://`, every file at one commit.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use object_store::HeaderMap;

use super::error::{Redactor, RemoteError, RemoteErrorKind};
use super::hub::{HubConfig, HubFileMeta, is_commit};
use super::object::{Backend, RemoteObject};
use super::store::{self, IoRuntime, StoreEnv, Tuning};
use super::url::{RemoteUrl, StoreKind};
use super::watch::Interrupt;

/// Everything a remote load is configured by, read once.
#[derive(Debug, Clone)]
pub(crate) struct RemoteSettings {
    pub env: StoreEnv,
    pub hub: HubConfig,
    pub tuning: Tuning,
}

impl RemoteSettings {
    /// From the process's environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`, `HF_*`).
    pub(crate) fn from_env() -> Self {
        Self {
            env: StoreEnv::Process,
            hub: HubConfig::from_env(),
            tuning: Tuning::from_env(),
        }
    }
}

/// The hub's side of a location: the repository, the revision, and the commit's client
/// once a file's answer named it.
#[derive(Debug)]
struct HubRepo {
    repo: String,
    revision: String,
    /// Redirects are not followed: the hub's metadata is on its 302 to the CDN.
    client: reqwest::Client,
    pinned: Mutex<Option<(String, Arc<Backend>)>>,
}

impl HubRepo {
    fn pinned(&self) -> MutexGuard<'_, Option<(String, Arc<Backend>)>> {
        self.pinned.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The address of `key`, at the pinned commit, else at the revision asked.
    fn shown(&self, key: &str) -> String {
        let pinned = self.pinned();
        let revision = pinned.as_ref().map_or(self.revision.as_str(), |(c, _)| c);
        format!("hf://{}@{}/{key}", self.repo, revision.replace('/', "%2F"))
    }
}

/// What the hub says of a file ([`RemoteLocation::hub_lookup`]): the commit (empty where no
/// answer named one), and the metadata or `None` where the file does not exist; `None` for
/// another store.
pub(crate) type HubLookup = Option<Result<(String, Option<HubFileMeta>), RemoteError>>;

/// The hub's answer to a HEAD of a file.
enum Head {
    /// The file, with its metadata.
    Found(HubFileMeta),
    /// No such file (the commit `None` where the answer does not name it).
    Missing { commit: Option<String> },
}

/// A remote checkpoint's place; no request is sent until a file is opened.
#[derive(Debug)]
pub(crate) struct RemoteLocation {
    setup: Setup,
    /// The key prefix of the files under the base: empty or ending in `/`.
    prefix: String,
    /// The file the address named, where it named one.
    file: Option<String>,
    place: Place,
}

/// The client a location reads through.
#[derive(Debug)]
enum Place {
    /// The store's client (`s3://`, `gs://`, `az://`, `http(s)://`).
    Store(Arc<Backend>),
    /// A hub repository, whose client is made once the commit is known.
    Hub(HubRepo),
}

fn bad_url(text: &str, detail: impl Into<String>) -> RemoteError {
    RemoteError::new(RemoteErrorKind::BadUrl, text, detail.into())
}

/// Splits `key` into its directory's prefix (empty or ending in `/`) and its file's name.
fn split_key(key: &str, names_file: bool) -> (String, Option<String>) {
    if !names_file {
        let prefix = if key.is_empty() {
            String::new()
        } else {
            format!("{key}/")
        };
        return (prefix, None);
    }
    match key.rsplit_once('/') {
        Some((dir, name)) => (format!("{dir}/"), Some(name.to_owned())),
        None => (String::new(), Some(key.to_owned())),
    }
}

/// What a location's clients are built from.
#[derive(Debug)]
struct Setup {
    shown: String,
    names_file: bool,
    settings: RemoteSettings,
    runtime: Arc<IoRuntime>,
    redactor: Redactor,
}

/// A location's key prefix, the file it names, and its client.
type Parts = (String, Option<String>, Place);

impl Setup {
    fn backend(
        &self,
        store: Arc<dyn object_store::ObjectStore>,
        shown_base: String,
    ) -> Arc<Backend> {
        Arc::new(Backend {
            store,
            runtime: Arc::clone(&self.runtime),
            tuning: self.settings.tuning.clone(),
            shown_base,
            redactor: self.redactor.clone(),
        })
    }

    /// `s3://`, `gs://`, `az://`: the bucket's client, the key's prefix and file.
    fn store(&self, kind: StoreKind, bucket: &str, key: &str) -> Result<Parts, RemoteError> {
        let base = RemoteUrl::Store {
            kind,
            bucket: bucket.to_owned(),
            key: String::new(),
        };
        let shown_base = format!("{base}/");
        let (env, tuning) = (&self.settings.env, &self.settings.tuning);
        let s = store::bucket_store(kind, bucket, env, tuning, &self.redactor, &self.shown)?;
        let (prefix, file) = split_key(key, self.names_file);
        Ok((prefix, file, Place::Store(self.backend(s, shown_base))))
    }

    /// `http(s)://`: the client of the base.
    fn http(&self, base: &str, name: &str, query: bool) -> Result<Parts, RemoteError> {
        if query {
            // NOTE: object_store's HTTP store builds each request's URL from its base
            // and the object's path, so a query (a presigned URL's signature) cannot
            // be carried; presigned URLs need the read on reqwest directly.
            let what = "URLs with a query are not supported yet";
            return Err(bad_url(&self.shown, what));
        }
        let (base, file) = if self.names_file || name.is_empty() {
            (base.to_owned(), self.names_file.then(|| name.to_owned()))
        } else {
            (format!("{base}{name}/"), None)
        };
        let shown_base = super::url::without_userinfo(&base);
        let tuning = &self.settings.tuning;
        let s = store::http_store(&base, HeaderMap::new(), tuning, &self.redactor, &self.shown)?;
        Ok((
            String::new(),
            file,
            Place::Store(self.backend(s, shown_base)),
        ))
    }

    /// `hf://`: the hub's client; the commit's is made once an answer names it.
    fn hub(
        &self,
        repo: &str,
        revision: Option<&str>,
        subfolder: &str,
    ) -> Result<Parts, RemoteError> {
        let tuning = &self.settings.tuning;
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(tuning.request_timeout)
            .connect_timeout(tuning.connect_timeout)
            .build()
            .map_err(|e| {
                let text = self.redactor.error_text(&e);
                RemoteError::new(RemoteErrorKind::Config, &self.shown, text)
            })?;
        let hub = HubRepo {
            repo: repo.to_owned(),
            revision: revision.unwrap_or("main").to_owned(),
            client,
            pinned: Mutex::new(None),
        };
        let (prefix, _) = split_key(subfolder, false);
        Ok((prefix, None, Place::Hub(hub)))
    }
}

impl RemoteLocation {
    /// Parses `text` and builds the client it needs, on `runtime`.
    pub(crate) fn new(
        text: &str,
        settings: RemoteSettings,
        runtime: Arc<IoRuntime>,
    ) -> Result<Self, RemoteError> {
        let url = RemoteUrl::parse(text)
            .map_err(|e| bad_url(&super::url::shown_refused(text), e.reason))?;
        let mut redactor = Redactor::default();
        settings.env.add_secrets(&mut redactor);
        if let Some(token) = &settings.hub.token {
            redactor.add(token.secret());
        }
        let setup = Setup {
            shown: url.to_string(),
            names_file: url.names_file(),
            settings,
            runtime,
            redactor,
        };
        let (prefix, file, place) = match &url {
            RemoteUrl::Store { kind, bucket, key } => setup.store(*kind, bucket, key)?,
            RemoteUrl::Http { base, name, query } => setup.http(base, name, query.is_some())?,
            RemoteUrl::Hub {
                repo,
                revision,
                subfolder,
                ..
            } => setup.hub(repo, revision.as_deref(), subfolder)?,
        };
        Ok(RemoteLocation {
            setup,
            prefix,
            file,
            place,
        })
    }

    /// The file the address named, `None` for a prefix or a repository.
    pub(crate) fn file(&self) -> Option<&str> {
        self.file.as_deref()
    }

    /// The address the file `name` is shown by (at the pinned commit for `hf://`).
    pub(crate) fn shown_file(&self, name: &str) -> String {
        format!("{}{name}", self.shown_prefix_slash())
    }

    /// The address of the location's prefix, as shown, without its last `/`.
    pub(crate) fn shown_prefix(&self) -> String {
        let mut shown = self.shown_prefix_slash();
        if shown.ends_with('/') && !shown.ends_with("://") {
            shown.pop();
        }
        shown
    }

    fn shown_prefix_slash(&self) -> String {
        let base = match &self.place {
            Place::Store(backend) => backend.shown_base.clone(),
            Place::Hub(hub) => hub.shown(""),
        };
        format!("{base}{}", self.prefix)
    }

    /// The commit an `hf://` location is pinned to, once a file was opened.
    #[cfg(test)]
    pub(crate) fn commit(&self) -> Option<String> {
        let Place::Hub(hub) = &self.place else {
            return None;
        };
        hub.pinned().as_ref().map(|(commit, _)| commit.clone())
    }

    /// Opens the file `name` of the location (a shard's name, relative to its prefix).
    pub(crate) fn open_file(&self, name: &str) -> Result<RemoteObject, RemoteError> {
        let key = format!("{}{name}", self.prefix);
        match &self.place {
            Place::Store(backend) => RemoteObject::open(backend, &key, None),
            Place::Hub(hub) => match self.hub_file(hub, &key)? {
                (Some(meta), Some(backend)) => RemoteObject::open(&backend, &key, Some(meta)),
                _ => Err(self.hub_missing(hub, &key)),
            },
        }
    }

    /// What the hub says of `name` by one HEAD at the revision (the pinned commit once
    /// there is one), the commit pinned from now on ([`HubLookup`]).
    pub(crate) fn hub_lookup(&self, name: &str) -> HubLookup {
        let Place::Hub(hub) = &self.place else {
            return None;
        };
        let key = format!("{}{name}", self.prefix);
        Some(self.hub_file(hub, &key).map(|(meta, _)| {
            let commit = hub.pinned().as_ref().map(|(c, _)| c.clone());
            let commit = commit.unwrap_or_default();
            (commit, meta)
        }))
    }

    /// Opens `name` of an `hf://` location whose metadata a [`Self::hub_lookup`] gave.
    pub(crate) fn open_known(
        &self,
        name: &str,
        meta: HubFileMeta,
    ) -> Result<RemoteObject, RemoteError> {
        let key = format!("{}{name}", self.prefix);
        let backend = match &self.place {
            Place::Hub(hub) => hub.pinned().as_ref().map(|(_, b)| Arc::clone(b)),
            Place::Store(backend) => Some(Arc::clone(backend)),
        };
        match backend {
            Some(backend) => RemoteObject::open(&backend, &key, Some(meta)),
            None => self.open_file(name),
        }
    }

    fn hub_missing(&self, hub: &HubRepo, key: &str) -> RemoteError {
        let detail = "HTTP 404 EntryNotFound".into();
        RemoteError::new(RemoteErrorKind::NotFound, hub.shown(key), detail)
    }

    /// The hub's metadata of `key` (`None`: it does not exist), and the pinned commit's
    /// client (pinned by the first answer that names a commit).
    fn hub_file(
        &self,
        hub: &HubRepo,
        key: &str,
    ) -> Result<(Option<HubFileMeta>, Option<Arc<Backend>>), RemoteError> {
        let pinned = hub.pinned().clone();
        let revision = pinned.as_ref().map_or(hub.revision.as_str(), |(c, _)| c);
        let config = &self.setup.settings.hub;
        let url = config.resolve_url(&hub.repo, revision, key);
        let shown = format!("hf://{}@{}/{key}", hub.repo, revision.replace('/', "%2F"));
        let (meta, answered) = match self.hub_head(hub, &url, &shown)? {
            Head::Found(meta) => {
                let commit = meta.commit.clone();
                (Some(meta), commit)
            }
            Head::Missing { commit } => (None, commit),
        };
        // A commit asked for is the commit: an answer for another one (a mirror or proxy
        // that serves a branch for anything) is refused, never filed under the one asked.
        let asked = pinned
            .as_ref()
            .map(|(pin, _)| pin.as_str())
            .or_else(|| is_commit(&hub.revision).then_some(hub.revision.as_str()));
        let commit = match (&answered, asked) {
            (Some(c), Some(asked)) if c != asked => {
                let detail = format!("the hub answered for commit {c}, not {asked}");
                return Err(RemoteError::new(RemoteErrorKind::Changed, shown, detail));
            }
            (Some(c), _) => c.clone(),
            (None, Some(asked)) => asked.to_owned(),
            (None, None) if meta.is_none() => return Ok((None, None)),
            (None, None) => {
                let detail = "the hub's answer names no commit (X-Repo-Commit)".to_owned();
                return Err(RemoteError::new(RemoteErrorKind::Protocol, shown, detail));
            }
        };
        if let Some((_, backend)) = pinned {
            return Ok((meta, Some(backend)));
        }
        let mut headers = HeaderMap::new();
        if let Some(token) = &config.token {
            let value = format!("Bearer {}", token.secret());
            if let Ok(mut value) = object_store::HeaderValue::from_str(&value) {
                value.set_sensitive(true);
                headers.insert("authorization", value);
            }
        }
        let base = config.resolve_base(&hub.repo, &commit);
        let shown_base = format!("hf://{}@{commit}/", hub.repo);
        let (tuning, redactor) = (&self.setup.settings.tuning, &self.setup.redactor);
        let store = store::http_store(&base, headers, tuning, redactor, &shown_base)?;
        let backend = self.setup.backend(store, shown_base);
        let mut slot = hub.pinned();
        // Two files opened at once may both pin: the first one's pin stands, and the
        // other's file is checked against it.
        match &*slot {
            Some((pin, backend)) if *pin == commit => Ok((meta, Some(Arc::clone(backend)))),
            Some((pin, _)) => {
                let detail = format!("the hub answered for commit {commit}, not {pin}");
                Err(RemoteError::new(RemoteErrorKind::Changed, shown, detail))
            }
            None => {
                *slot = Some((commit, Arc::clone(&backend)));
                Ok((meta, Some(backend)))
            }
        }
    }

    /// A HEAD of a resolve URL, not following the redirect, retried after a 5xx, a 429 or a
    /// transport error; one unanswered for the pace's window is sent once more. A 404
    /// `EntryNotFound` is [`Head::Missing`]; a refusal is typed ([`head_answer`]); a hub
    /// that never answers is [`RemoteErrorKind::Unreachable`].
    fn hub_head(&self, hub: &HubRepo, url: &str, shown: &str) -> Result<Head, RemoteError> {
        let tuning = &self.setup.settings.tuning;
        let token = self.setup.settings.hub.token.as_ref();
        let mut backoff = tuning.init_backoff;
        let mut last = String::new();
        // Whether the last try failed to reach the hub at all.
        let mut unreached = false;
        let (mut stalls, mut refused) = (0, 0);
        for attempt in 0..=tuning.max_retries {
            if attempt > 0 {
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(tuning.max_backoff);
            }
            let mut request = hub.client.head(url);
            if let Some(token) = token {
                request = request.bearer_auth(token.secret());
            }
            // `send` arms its timeout when called: inside the runtime.
            let answer = self
                .setup
                .runtime
                .request(tuning.pace, |_| async move { request.send().await });
            let response = match answer {
                Ok(Ok(response)) => response,
                Ok(Err(e)) => {
                    last = self.setup.redactor.error_text(&e);
                    unreached = e.is_connect() || e.is_timeout();
                    refused += usize::from(e.is_connect());
                    if refused > 1 {
                        break;
                    }
                    continue;
                }
                Err(Interrupt::Stalled { .. }) if stalls < tuning.pace.retries => {
                    stalls += 1;
                    continue;
                }
                Err(Interrupt::Stalled { .. }) => {
                    let (secs, var) = (tuning.pace.window.as_secs_f64(), super::watch::STALL_VAR);
                    let detail = format!("no answer to a HEAD in {secs:.0} s, twice ({var})");
                    let kind = RemoteErrorKind::Unreachable;
                    return Err(RemoteError::new(kind, shown, detail));
                }
                Err(Interrupt::Cancelled) => {
                    let detail = "the load was cancelled".to_owned();
                    return Err(RemoteError::new(RemoteErrorKind::Cancelled, shown, detail));
                }
            };
            if let Some(done) = head_answer(&response, shown, &self.setup.redactor) {
                return done;
            }
            last = format!("HTTP {}", response.status().as_u16());
            unreached = false;
        }
        let tries = Some(refused).filter(|r| *r > 1);
        let detail = format!("{last} ({} tries)", tries.unwrap_or(tuning.max_retries + 1));
        let kind = match unreached {
            true => RemoteErrorKind::Unreachable,
            false => RemoteErrorKind::Failed,
        };
        Err(RemoteError::new(kind, shown, detail))
    }
}

/// What the hub's answer to a HEAD says: the file, its absence, or a typed refusal
/// ([`refusal`]); `None` for an answer to try again (a 5xx, a 429).
fn head_answer(
    response: &reqwest::Response,
    shown: &str,
    redactor: &Redactor,
) -> Option<Result<Head, RemoteError>> {
    let status = response.status().as_u16();
    let headers = response.headers();
    let header = |name: &str| {
        let value = headers.get(name)?.to_str().ok()?;
        Some(value.to_owned())
    };
    let code = header("x-error-code").unwrap_or_default();
    match status {
        200..=399 => Some(Ok(Head::Found(HubFileMeta::from_headers(status, header)))),
        404 if code == "EntryNotFound" => {
            let commit = header("x-repo-commit").filter(|c| is_commit(c));
            Some(Ok(Head::Missing { commit }))
        }
        429 | 500..=599 => None,
        _ => {
            // The hub says which of repository, revision or file is missing.
            let detail = format!("HTTP {status} {code}").trim_end().to_owned();
            let kind = refusal(status, &code);
            Some(Err(RemoteError::new(kind, shown, redactor.scrub(&detail))))
        }
    }
}

/// What the hub's refusal (`status`, `X-Error-Code`) means: the code first (401
/// `RepoNotFound` for a private repository, `GatedRepo` for a gated one), then the status.
fn refusal(status: u16, code: &str) -> RemoteErrorKind {
    match (code, status) {
        ("RepoNotFound", _) => RemoteErrorKind::RepoNotFound,
        ("RevisionNotFound", _) => RemoteErrorKind::RevisionNotFound,
        ("EntryNotFound", _) | (_, 404) => RemoteErrorKind::NotFound,
        ("GatedRepo", _) => RemoteErrorKind::Gated,
        (_, 401 | 403) => RemoteErrorKind::Denied,
        _ => RemoteErrorKind::Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hubs_refusals_are_typed_by_its_error_code_then_by_the_status() {
        use RemoteErrorKind as K;
        #[rustfmt::skip]
        let table = [
            (404, "RepoNotFound", K::RepoNotFound), (401, "RepoNotFound", K::RepoNotFound),
            (404, "RevisionNotFound", K::RevisionNotFound),
            (404, "EntryNotFound", K::NotFound), (404, "", K::NotFound),
            (401, "GatedRepo", K::Gated), (403, "GatedRepo", K::Gated),
            (401, "", K::Denied), (403, "", K::Denied), (403, "DisabledRepo", K::Denied),
            (400, "", K::Failed), (418, "SomethingNew", K::Failed),
        ];
        for (status, code, kind) in table {
            assert_eq!(refusal(status, code), kind, "{status} {code}");
        }
    }

    #[test]
    fn keys_split_into_a_prefix_and_a_file() {
        let s = |k, f| split_key(k, f);
        assert_eq!(s("", false), (String::new(), None));
        assert_eq!(s("models/llama", false), ("models/llama/".into(), None));
        assert_eq!(
            s("m/model.safetensors", true),
            ("m/".into(), Some("model.safetensors".into()))
        );
        assert_eq!(
            s("model.safetensors", true),
            (String::new(), Some("model.safetensors".into()))
        );
    }
}
