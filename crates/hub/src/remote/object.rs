//! One remote object opened for a load: its length and ETag from a first ranged GET, then positional reads by ranged GETs that require that ETag.

mod bounded;
mod read;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, GetResult, ObjectStore, ObjectStoreExt};

use super::error::{Redactor, RemoteError, RemoteErrorKind};
use super::hub::HubFileMeta;
use super::store::{IoRuntime, Tuning};
use super::watch::{Interrupt, Moved};
use super::whole::{self, WholeAnswer};
use crate::error::{Error, Operation};
use crate::mount::Mount;
use crate::source::{Source, Version, VersionTag};

/// What the objects of one bucket, HTTP base or pinned hub revision share.
#[derive(Debug)]
pub(crate) struct Backend {
    pub store: Arc<dyn ObjectStore>,
    pub runtime: Arc<IoRuntime>,
    pub tuning: Tuning,
    /// The base as shown, ending in `/` (`s3://bucket/`, `hf://org/repo@<commit>/`).
    pub shown_base: String,
    pub redactor: Redactor,
}

/// What the open's first GET gives where the range was honoured.
struct FirstBody {
    len: u64,
    etag: Option<String>,
    /// The bytes received (no more than `want`, those asked), and whether the
    /// body went on past them.
    prefix: Vec<u8>,
    overran: bool,
    want: u64,
}

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
        // The HTTP store's answer to a 200 for a ranged GET (`RangeNotSupported`).
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
/// NOTE: retries are `object_store`'s (`RetryConfig`, from [`Tuning`]): a 5xx, a 429, a
/// connection error, a timeout, a body that breaks off (resumed under the same ETag); a
/// second loop here would multiply the bounds. This type adds only what it does not do:
/// a body that ends cleanly but short, a server that ignores `Range`, errors naming ranges.
#[derive(Debug)]
pub(crate) struct RemoteObject {
    backend: Arc<Backend>,
    location: ObjectPath,
    shown: PathBuf,
    version: Version,
    /// The ETag seen at open, required by `If-Match` on every later request.
    etag: Option<String>,
    hub: Option<HubFileMeta>,
    /// The first bytes, read by the open.
    prefix: Vec<u8>,
    /// Set once the server answered a range with the whole object.
    ranges_ignored: AtomicBool,
    /// The whole object, fetched once where ranges are ignored.
    whole: Mutex<Option<Arc<Vec<u8>>>>,
    requests: AtomicU64,
}

impl RemoteObject {
    /// The cancel flags of the load that resolved it, which stop its requests.
    pub(crate) fn cancel(&self) -> &crate::cancel::Cancel {
        self.backend.runtime.cancel()
    }

    /// Opens `key` (relative to the base) with one ranged GET of its first
    /// [`Tuning::open_prefix`] bytes, which gives its length and ETag. Where the server
    /// ignores the range, the bytes asked are kept and the rest left unread (`whole.rs`);
    /// an object past half the memory headroom is refused at once. An empty object (416),
    /// or a whole answer without a length, costs a HEAD more.
    pub(crate) fn open(
        backend: &Arc<Backend>,
        key: &str,
        hub: Option<HubFileMeta>,
    ) -> Result<RemoteObject, RemoteError> {
        let shown = format!("{}{key}", backend.shown_base);
        let location = ObjectPath::parse(key).map_err(|e| {
            let text = backend.redactor.error_text(&e);
            RemoteError::new(RemoteErrorKind::BadUrl, &shown, text)
        })?;
        let object = RemoteObject {
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
        let (opened, answer) = object.first_get(first.clone())?;
        match opened {
            Ok(body) => {
                if body.prefix.len() as u64 != body.want || body.overran {
                    let detail = if body.overran {
                        "a first body longer than the range asked"
                    } else {
                        "a short first body"
                    };
                    let e = object.error(RemoteErrorKind::Protocol, detail.into());
                    return Err(e.with_range(0..body.want));
                }
                object.finish_open(body.len, body.etag, body.prefix)
            }
            Err(e) => object.open_after(&e, answer, first),
        }
    }

    /// The open's ranged GET of `first`, and the whole answer's first bytes where the
    /// server ignored the range.
    fn first_get(
        &self,
        first: Range<u64>,
    ) -> Result<(object_store::Result<FirstBody>, Option<WholeAnswer>), RemoteError> {
        let keep = usize::try_from(first.end).unwrap_or(usize::MAX);
        self.retrying_stalls(first.clone(), |moved| {
            let options = GetOptions {
                range: Some(GetRange::Bounded(first.clone())),
                ..GetOptions::default()
            };
            whole::keeping(keep, Arc::clone(&moved), async move {
                let result = self.get(options).await?;
                let (len, etag) = (result.meta.size, result.meta.e_tag.clone());
                // No more than asked, whatever the answer says.
                let want = (result.range.end - result.range.start).min(keep as u64);
                let mut prefix = Vec::with_capacity(want as usize);
                let mut stream = result.into_stream();
                let mut overran = false;
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk?;
                    moved.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    overran = prefix.len() + chunk.len() > want as usize;
                    if overran {
                        break;
                    }
                    prefix.extend_from_slice(&chunk);
                }
                Ok::<_, object_store::Error>(FirstBody {
                    len,
                    etag,
                    prefix,
                    overran,
                    want,
                })
            })
        })
    }

    /// The open after its first GET failed with `e`: a typed error, the whole answer's
    /// first bytes, or a HEAD (ranges ignored, an empty object's 416).
    fn open_after(
        self,
        e: &object_store::Error,
        answer: Option<WholeAnswer>,
        first: Range<u64>,
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
        if let Some(answer) = answer {
            return self.open_whole(answer);
        }
        // Ranges ignored, or an answer such as 416 for an empty object: the HEAD says.
        let head = self.retrying_stalls(0..0, |_| self.head())?;
        match head {
            Ok(meta) if failure == Failure::RangeIgnored || meta.size == 0 => self
                .finish_open(meta.size, meta.e_tag, Vec::new())?
                .fits_whole(),
            _ => {
                let e = self.error(RemoteErrorKind::Failed, text);
                Err(e.with_range(first))
            }
        }
    }

    /// The open of an object whose server answered the range with all of it: the whole
    /// object where it was no longer than the range, else its first bytes and length.
    fn open_whole(self, answer: WholeAnswer) -> Result<RemoteObject, RemoteError> {
        self.ranges_ignored.store(true, Ordering::Relaxed);
        if answer.complete {
            // Every byte any read asks for.
            let len = answer.bytes.len() as u64;
            return self.finish_open(len, answer.etag, answer.bytes);
        }
        let (len, etag) = match answer.stated {
            Some(len) => (len, answer.etag),
            None => {
                let meta = self.retrying_stalls(0..0, |_| self.head())?.map_err(|e| {
                    let text = self.backend.redactor.error_text(&e);
                    self.error(RemoteErrorKind::Failed, text)
                })?;
                (meta.size, answer.etag.or(meta.e_tag))
            }
        };
        if answer.bytes.len() as u64 > len {
            let detail = format!("more bytes than the object's length, {len}");
            return Err(self
                .error(RemoteErrorKind::Protocol, detail)
                .with_range(0..len));
        }
        self.finish_open(len, etag, answer.bytes)?.fits_whole()
    }

    /// Itself where its whole object may be held in memory (`bounded::open_cap`), as a
    /// server that ignores `Range` needs; else the error.
    fn fits_whole(self) -> Result<RemoteObject, RemoteError> {
        let cap = bounded::open_cap(self.hub.as_ref());
        let len = self.version.len;
        if self.ranges_ignored() && len > self.prefix.len() as u64 && len > cap {
            return Err(self.past_cap(len, cap));
        }
        Ok(self)
    }

    /// Opened at `len` bytes, `etag` and the first bytes `prefix`: the version from the
    /// ETag, checked against what the hub said.
    fn finish_open(
        mut self,
        len: u64,
        etag: Option<String>,
        prefix: Vec<u8>,
    ) -> Result<RemoteObject, RemoteError> {
        let tag = etag.clone().map_or(VersionTag::Unknown, VersionTag::ETag);
        (self.version, self.etag, self.prefix) = (Version { len, tag }, etag, prefix);
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

    pub(crate) fn etag(&self) -> Option<&str> {
        self.etag.as_deref()
    }

    /// What the hub said of the file (`hf://` only): its commit and SHA-256.
    pub(crate) fn hub(&self) -> Option<&HubFileMeta> {
        self.hub.as_ref()
    }

    /// How many of its first bytes the open keeps: reads within them send nothing.
    pub(crate) fn kept_prefix(&self) -> u64 {
        self.prefix.len() as u64
    }

    /// Requests this object sent (the open's included; `object_store`'s retries not).
    #[cfg(test)]
    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

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

    /// Runs the request `make` gives on the backend's runtime, watched; a stalled one
    /// again, up to the pace's retries.
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
}

/// The version is the ETag seen at open; a server that gives none leaves it `Unknown`
/// (only the length is checked, and no node copy is shared).
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
