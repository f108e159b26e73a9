//! One remote object opened for a load: its length and ETag from a first ranged GET, then
//! positional reads by ranged GETs that require that ETag, resumed where a body broke off.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, GetResult, ObjectStore, ObjectStoreExt};

use super::error::{Redactor, RemoteError, RemoteErrorKind};
use super::hub::HubFileMeta;
use super::landing::{Filling, Landing};
use super::store::{IoRuntime, Tuning};
use super::watch::{Interrupt, Moved};
use super::whole::{self, Whole};
use crate::error::{Error, Operation};
use crate::mount::Mount;
use crate::source::{Source, Version, VersionTag};

/// What the objects of one bucket, HTTP base or pinned hub revision share.
#[derive(Debug)]
pub(crate) struct Backend {
    pub store: Arc<dyn ObjectStore>,
    pub runtime: Arc<IoRuntime>,
    pub tuning: Tuning,
    /// The address of the base as shown, ending in `/` (`s3://bucket/`, `hf://org/repo@<commit>/`).
    pub shown_base: String,
    pub redactor: Redactor,
}

/// What the open's first GET gives: the object's length, its ETag, the bytes received,
/// and the bytes asked for.
type FirstGet = object_store::Result<(u64, Option<String>, Vec<u8>, u64)>;

/// How a failed request is handled, from `object_store`'s error kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    NotFound,
    Denied,
    /// 412 on `If-Match`.
    Changed,
    /// The server answered a range with the whole object (200).
    RangeIgnored,
    /// Anything else, after `object_store`'s own retries.
    Other,
}

fn classify(e: &object_store::Error) -> Failure {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => Failure::NotFound,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => Failure::Denied,
        E::Precondition { .. } => Failure::Changed,
        // The HTTP store's answer to a 200 for a ranged GET (`RangeNotSupported`); its ranged
        // GETs are the only reads here that can be "not supported".
        E::NotSupported { .. } => Failure::RangeIgnored,
        // The cloud stores' `NotPartial`, a private type: known by its text only.
        E::Generic { source, .. } if source.to_string().contains("non-partial response") => {
            Failure::RangeIgnored
        }
        _ => Failure::Other,
    }
}

/// A remote object, opened once: every read requires the version seen then.
///
/// NOTE: retries are `object_store`'s (`RetryConfig`, from [`Tuning`]): it retries a request
/// after a 5xx, a 429, a connection error or a timeout, and a body that breaks off (a reset,
/// a body shorter than its `Content-Length`) from the byte where it stopped, with the same
/// ETag required; a 4xx is never retried. A second retry loop here would multiply the
/// bounds; this type only adds what the client does not do: a body that ends cleanly but
/// short, a server that ignores `Range`, and the error naming the range.
#[derive(Debug)]
pub(crate) struct RemoteObject {
    backend: Arc<Backend>,
    location: ObjectPath,
    shown: PathBuf,
    version: Version,
    /// The ETag seen at open, required by `If-Match` on every later request; `None` where
    /// the server gives none (then only the length is checked).
    etag: Option<String>,
    hub: Option<HubFileMeta>,
    /// The first bytes, read by the open.
    prefix: Vec<u8>,
    /// Set once the server answered a range with the whole object.
    ranges_ignored: AtomicBool,
    /// The whole object, fetched once where ranges are ignored.
    whole: Mutex<Option<Arc<[u8]>>>,
    requests: AtomicU64,
}

impl RemoteObject {
    /// Opens `key` (relative to the backend's base) with one ranged GET of its first
    /// [`Tuning::open_prefix`] bytes, which gives its length and ETag. A server that ignores
    /// the range answers with the whole object, which is kept (`whole.rs`): every read is
    /// then served from it, and the file costs that one request. An empty object (416), or
    /// a whole answer that could not be kept (no `Content-Length`), costs a HEAD more.
    pub(crate) fn open(
        backend: &Arc<Backend>,
        key: &str,
        hub: Option<HubFileMeta>,
    ) -> Result<RemoteObject, RemoteError> {
        let shown = format!("{}{key}", backend.shown_base);
        let location = ObjectPath::parse(key).map_err(|e| {
            RemoteError::new(
                RemoteErrorKind::BadUrl,
                &shown,
                backend.redactor.error_text(&e),
            )
        })?;
        let mut object = RemoteObject {
            backend: Arc::clone(backend),
            location,
            shown: PathBuf::from(&shown),
            version: Version {
                len: 0,
                tag: VersionTag::Unknown,
            },
            etag: None,
            hub,
            prefix: Vec::new(),
            ranges_ignored: AtomicBool::new(false),
            whole: Mutex::new(None),
            requests: AtomicU64::new(0),
        };
        let first = 0..backend.tuning.open_prefix.max(1);
        let cap = whole_cap(object.hub.as_ref());
        let (opened, kept) = object.first_get(first.clone(), cap)?;
        match opened {
            Ok((len, etag, prefix, want)) => {
                if prefix.len() as u64 != want {
                    let e = object.error(RemoteErrorKind::Protocol, "a short first body".into());
                    return Err(e.with_range(0..want));
                }
                object.version.len = len;
                object.etag = etag;
                object.prefix = prefix;
                object.finish_open()
            }
            Err(e) => object.open_after(&e, kept, first, cap),
        }
    }

    /// The open's ranged GET of `first`: the object's length, ETag, the bytes received
    /// and the bytes asked for; and the whole object where the server answered with it.
    fn first_get(&self, first: Range<u64>, cap: u64) -> Result<(FirstGet, Whole), RemoteError> {
        self.retrying_stalls(first.clone(), |moved| {
            let options = GetOptions {
                range: Some(GetRange::Bounded(first.clone())),
                ..GetOptions::default()
            };
            whole::keeping(cap, Arc::clone(&moved), async move {
                let result = self.get(options).await?;
                let (len, etag) = (result.meta.size, result.meta.e_tag.clone());
                let want = result.range.end - result.range.start;
                let mut prefix = Vec::with_capacity(want as usize);
                let mut stream = result.into_stream();
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk?;
                    moved.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    prefix.extend_from_slice(&chunk);
                }
                Ok::<_, object_store::Error>((len, etag, prefix, want))
            })
        })
    }

    /// The open after its first GET failed with `e`: a typed error for a missing, denied
    /// or changed object; the whole object where the server sent it for the range (or an
    /// error past `cap`); else, for ranges ignored or an empty object (416), a HEAD.
    fn open_after(
        mut self,
        e: &object_store::Error,
        kept: Whole,
        first: Range<u64>,
        cap: u64,
    ) -> Result<RemoteObject, RemoteError> {
        let failure = classify(e);
        let text = self.backend.redactor.error_text(e);
        match failure {
            Failure::NotFound => return Err(self.error(RemoteErrorKind::NotFound, text)),
            Failure::Denied => return Err(self.error(RemoteErrorKind::Denied, text)),
            Failure::Changed => return Err(self.error(RemoteErrorKind::Changed, text)),
            Failure::RangeIgnored => self.ranges_ignored.store(true, Ordering::Relaxed),
            Failure::Other => {}
        }
        match (failure, kept) {
            (Failure::RangeIgnored, Whole::Kept(kept)) => {
                // The whole object, answered for the range: its length, its ETag, and
                // every byte any read asks for.
                self.version.len = kept.body.len() as u64;
                self.etag = kept.etag;
                self.prefix = kept.body;
                return self.finish_open();
            }
            (_, Whole::TooLarge(len)) => return Err(self.too_large(len, cap)),
            _ => {}
        }
        // Ranges ignored, or an answer such as 416 for an empty object: the HEAD says.
        let head = self.retrying_stalls(0..0, |_| self.head())?;
        match head {
            Ok(meta) if failure == Failure::RangeIgnored || meta.size == 0 => {
                self.version.len = meta.size;
                self.etag = meta.e_tag;
                self.finish_open()
            }
            _ => {
                let e = self.error(RemoteErrorKind::Failed, text);
                Err(e.with_range(first))
            }
        }
    }

    /// The version from the ETag seen, checked against what the hub said.
    fn finish_open(mut self) -> Result<RemoteObject, RemoteError> {
        if let Some(etag) = &self.etag {
            self.version.tag = VersionTag::ETag(etag.clone());
        }
        if let Some(size) = self.hub.as_ref().and_then(|h| h.size) {
            if size != self.version.len {
                let detail = format!(
                    "the hub says {size} bytes, the object has {}",
                    self.version.len
                );
                return Err(self.error(RemoteErrorKind::Changed, detail));
            }
        }
        Ok(self)
    }

    /// The ETag seen at open.
    pub(crate) fn etag(&self) -> Option<&str> {
        self.etag.as_deref()
    }

    /// What the hub said of the file (`hf://` only): its commit and SHA-256.
    pub(crate) fn hub(&self) -> Option<&HubFileMeta> {
        self.hub.as_ref()
    }

    /// How many of its first bytes the open read and keeps: reads within them send
    /// nothing.
    pub(crate) fn kept_prefix(&self) -> u64 {
        self.prefix.len() as u64
    }

    /// Requests this object sent (the open's included; `object_store`'s retries not).
    #[cfg(test)]
    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Whether the server was found to ignore `Range`.
    pub(crate) fn ranges_ignored(&self) -> bool {
        self.ranges_ignored.load(Ordering::Relaxed)
    }

    fn error(&self, kind: RemoteErrorKind, detail: String) -> RemoteError {
        RemoteError::new(kind, self.shown.to_string_lossy(), detail)
    }

    /// The error of a request of `range` dropped for `why`.
    fn interrupted(&self, why: Interrupt, range: Range<u64>) -> RemoteError {
        let (kind, detail) = match why {
            Interrupt::Cancelled => (RemoteErrorKind::Cancelled, "the load was cancelled".into()),
            Interrupt::Stalled { moved } => (
                RemoteErrorKind::Stalled,
                self.backend.tuning.pace.stall_words(range.start + moved),
            ),
        };
        self.error(kind, detail).with_range(range)
    }

    /// A whole answer stating `len` bytes, past `cap`.
    fn too_large(&self, len: u64, cap: u64) -> RemoteError {
        let detail = format!(
            "the server ignores Range and answers with the whole object, {len} bytes, more \
             than the {cap} bytes it may take in memory"
        );
        self.error(RemoteErrorKind::Protocol, detail)
    }

    /// Runs the request `make` gives (of `range`, for the error) on the backend's runtime,
    /// watched; a stalled one again, from the start, up to the pace's retries.
    fn retrying_stalls<F: std::future::Future + Send>(
        &self,
        range: Range<u64>,
        mut make: impl FnMut(Moved) -> F,
    ) -> Result<F::Output, RemoteError>
    where
        F::Output: Send,
    {
        let pace = self.backend.tuning.pace;
        let mut stalls = 0;
        loop {
            match self.backend.runtime.request(pace, &mut make) {
                Ok(out) => return Ok(out),
                Err(Interrupt::Stalled { .. }) if stalls < pace.retries => stalls += 1,
                Err(why) => return Err(self.interrupted(why, range)),
            }
        }
    }

    async fn get(&self, mut options: GetOptions) -> object_store::Result<GetResult> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        options.if_match = self.etag.clone();
        self.backend.store.get_opts(&self.location, options).await
    }

    async fn head(&self) -> object_store::Result<object_store::ObjectMeta> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.backend.store.head(&self.location).await
    }

    /// Fills `dst` from `offset` (all of it, or up to the object's end), at least
    /// `required` bytes, from the version opened. `landing`, where given, is handed the
    /// bytes in order as they arrive (at least every [`LAND_STEP`] of a long body, so that
    /// a cache writes them before the read ends), each once, all of them by an `Ok`.
    pub(crate) fn read(
        &self,
        dst: &mut [u8],
        required: usize,
        offset: u64,
        landing: Option<&Landing<'_>>,
    ) -> Result<(), RemoteError> {
        let len = self.version.len;
        let want = len.saturating_sub(offset).min(dst.len() as u64) as usize;
        let range = offset..offset + want as u64;
        if want < required {
            let detail = format!("the object has {len} bytes, {required} were required");
            let end = offset.saturating_add(required as u64);
            return Err(self
                .error(RemoteErrorKind::Protocol, detail)
                .with_range(offset..end));
        }
        let Some(dst) = dst.get_mut(..want).filter(|d| !d.is_empty()) else {
            return Ok(());
        };
        let in_memory = |bytes: &[u8], dst: &mut [u8]| {
            let src = usize::try_from(range.start)
                .ok()
                .and_then(|start| bytes.get(start..start + dst.len()));
            src.map(|src| dst.copy_from_slice(src)).is_some()
        };
        let land_all = |dst: &[u8]| {
            if let Some(land) = landing {
                land(range.start, dst);
            }
        };
        if in_memory(&self.prefix, dst) {
            land_all(dst);
            return Ok(());
        }
        if !self.ranges_ignored() {
            match self.read_ranges(dst, range.clone(), landing) {
                Some(result) => return result,
                None => self.ranges_ignored.store(true, Ordering::Relaxed),
            }
        }
        let whole = self.whole()?;
        if in_memory(&whole, dst) {
            land_all(dst);
            return Ok(());
        }
        // `whole()` checked its length against the object's: out of reach.
        let detail = "the whole object is shorter than its length".to_owned();
        Err(self
            .error(RemoteErrorKind::Protocol, detail)
            .with_range(range))
    }

    /// Ranged GETs until `dst` (the bytes of `range`) is full, each [`LAND_STEP`] that
    /// arrives handed to `landing`; `None` when the server turned out to ignore ranges
    /// before sending any byte.
    fn read_ranges(
        &self,
        dst: &mut [u8],
        range: Range<u64>,
        landing: Option<&Landing<'_>>,
    ) -> Option<Result<(), RemoteError>> {
        let mut filling = Filling::new(dst, range.start, landing);
        let pace = self.backend.tuning.pace;
        let mut stalls = 0;
        // Each pass is one request (with object_store's retries inside it); a pass only
        // repeats after a body that ended cleanly but short, or one that stalled, which are
        // bounded here.
        for _ in 0..=self.backend.tuning.max_retries + pace.retries {
            let from = range.start + filling.got as u64;
            let options = GetOptions {
                range: Some(GetRange::Bounded(from..range.end)),
                ..GetOptions::default()
            };
            let into = &mut filling;
            let pass = self.backend.runtime.request(pace, |moved| async move {
                let result = self.get(options).await?;
                let mut stream = result.into_stream();
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk?;
                    // The future runs on the reading thread (`block_on`): what the
                    // chunk is handed to costs the runtime nothing.
                    if !into.put(&chunk) {
                        return Ok(false);
                    }
                    moved.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
                Ok::<_, object_store::Error>(true)
            });
            let failed =
                |kind, detail| Some(Err(self.error(kind, detail).with_range(range.clone())));
            let pass = match pass {
                Ok(pass) => pass,
                Err(Interrupt::Stalled { .. }) if stalls < pace.retries => {
                    stalls += 1;
                    continue;
                }
                Err(why) => {
                    // The error's range starts at the byte reached.
                    let reached = range.start + filling.got as u64..range.end;
                    let why = match why {
                        Interrupt::Stalled { .. } => Interrupt::Stalled { moved: 0 },
                        cancelled => cancelled,
                    };
                    return Some(Err(self.interrupted(why, reached)));
                }
            };
            match pass {
                Ok(true) if filling.is_full() => {
                    filling.land();
                    return Some(Ok(()));
                }
                Ok(true) => continue,
                Ok(false) => {
                    let detail = "the server sent more than the range asked".into();
                    return failed(RemoteErrorKind::Protocol, detail);
                }
                Err(e) => return self.failed_get(&e, range, filling.got),
            }
        }
        let detail = format!(
            "short bodies: {} of {} bytes after {} requests",
            filling.got,
            filling.len(),
            self.backend.tuning.max_retries + 1
        );
        Some(Err(self
            .error(RemoteErrorKind::Failed, detail)
            .with_range(range)))
    }

    /// A ranged GET's failure, as an error of `range`; `None` where the server ignores
    /// ranges and sent nothing yet (`got`).
    fn failed_get(
        &self,
        e: &object_store::Error,
        range: Range<u64>,
        got: usize,
    ) -> Option<Result<(), RemoteError>> {
        let text = self.backend.redactor.error_text(e);
        let kind = match classify(e) {
            Failure::RangeIgnored if got == 0 => return None,
            Failure::RangeIgnored | Failure::Changed => RemoteErrorKind::Changed,
            Failure::NotFound => RemoteErrorKind::NotFound,
            Failure::Denied => RemoteErrorKind::Denied,
            Failure::Other => RemoteErrorKind::Failed,
        };
        Some(Err(self.error(kind, text).with_range(range)))
    }

    /// The whole object, fetched once (by the first reader; the others wait for it), for a
    /// server that ignores `Range`: each read then costs no request.
    ///
    /// NOTE: this holds the whole object in memory besides the load's destination. A server
    /// that ignores ranges is rare (a misconfigured proxy, a plain static server); fetching
    /// the object once per read instead would move it as many times as there are reads.
    fn whole(&self) -> Result<Arc<[u8]>, RemoteError> {
        let mut whole = self.whole.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(bytes) = &*whole {
            return Ok(Arc::clone(bytes));
        }
        let len = self.version.len;
        let cap = whole_cap(self.hub.as_ref());
        if len > cap {
            return Err(self.too_large(len, cap).with_range(0..len));
        }
        let fetched = self.retrying_stalls(0..len, |moved| async move {
            let result = self.get(GetOptions::default()).await?;
            // The length is the server's word: grown as bytes arrive, never reserved from
            // it, so that a lying length cannot ask for memory up front.
            let mut bytes = Vec::new();
            let mut stream = result.into_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                if bytes.len() + chunk.len() > len as usize {
                    return Ok(None);
                }
                moved.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                bytes.extend_from_slice(&chunk);
            }
            Ok::<_, object_store::Error>(Some(bytes))
        })?;
        let kind_of = |e: &object_store::Error| match classify(e) {
            Failure::NotFound => RemoteErrorKind::NotFound,
            Failure::Denied => RemoteErrorKind::Denied,
            Failure::Changed => RemoteErrorKind::Changed,
            Failure::RangeIgnored | Failure::Other => RemoteErrorKind::Failed,
        };
        match fetched {
            Ok(Some(bytes)) if bytes.len() as u64 == len => {
                let bytes: Arc<[u8]> = bytes.into();
                *whole = Some(Arc::clone(&bytes));
                Ok(bytes)
            }
            Ok(_) => {
                let detail = format!("the whole object is not {len} bytes");
                Err(self
                    .error(RemoteErrorKind::Changed, detail)
                    .with_range(0..len))
            }
            Err(e) => {
                let text = self.backend.redactor.error_text(&e);
                Err(self.error(kind_of(&e), text).with_range(0..len))
            }
        }
    }
}

/// The most bytes of a whole answer (a server that ignores `Range`) an object may hold in
/// memory: what the hub said the file is, where it said; else half the memory available
/// (`memory::available`), so that a stated length far past the checkpoint is refused before
/// a byte is kept.
fn whole_cap(hub: Option<&HubFileMeta>) -> u64 {
    match hub.and_then(|h| h.size) {
        Some(size) => size,
        None => crate::memory::available().map_or(u64::MAX, |available| available / 2),
    }
}

/// The version is the ETag seen at open (`VersionTag::ETag`), required by `If-Match` on
/// every later request; a server that gives none leaves it `Unknown` (then only the length
/// is checked, and no node copy is shared, since two versions could not be told apart).
impl Source for RemoteObject {
    fn path(&self) -> &Path {
        &self.shown
    }

    fn version(&self) -> &Version {
        &self.version
    }

    fn read_at(
        &self,
        dst: &mut [u8],
        required: usize,
        offset: u64,
    ) -> Result<(), (u64, std::io::Error)> {
        self.read(dst, required, offset, None).map_err(|e| {
            let at = e.range.as_ref().map_or(offset, |r| r.start);
            (at, e.into_io())
        })
    }

    fn mount(&self) -> Option<&Mount> {
        None
    }

    fn fetched_whole(&self) -> bool {
        self.ranges_ignored()
    }

    fn commit(&self) -> Option<&str> {
        self.hub.as_ref()?.commit.as_deref()
    }

    fn published_sha256(&self) -> Option<[u8; 32]> {
        crate::verify::parse_hex(self.hub.as_ref()?.sha256()?)
    }

    fn own_error(&self, operation: Operation, error: &std::io::Error) -> Option<Error> {
        let remote = error.get_ref()?.downcast_ref::<RemoteError>()?;
        Some(remote.clone().into_error(operation))
    }
}
