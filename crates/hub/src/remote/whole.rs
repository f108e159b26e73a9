//! A server that ignores `Range`: the first bytes of the whole object its answer to the open carries are kept, and the rest left unread, so that the open learns the object's length and ETag from that one request and holds no more than it asked for.
//!
//! `object_store` fails a ranged GET answered `200` and drops its body; the
//! open would then need a `HEAD`. Every store client is built on
//! [`KeepWhole`], which inside [`keeping`] reads such a body up to the bytes
//! asked (one poll more where it stated no length) and keeps them with the
//! stated length and ETag, dropping the connection with the rest.
//!
//! NOTE: the hook is `object_store`'s own seam for HTTP clients
//! (`HttpConnector`, `HttpService`): no second HTTP stack for one rare answer.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;

use futures_util::StreamExt;
use object_store::ClientOptions;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};

use super::watch::Moved;

/// What a server sent for [`keeping`]'s ranged request, where it answered `200`.
#[derive(Debug)]
pub(crate) struct WholeAnswer {
    /// The object's first bytes: all where `complete`, else those asked.
    pub bytes: Vec<u8>,
    /// Whether `bytes` is the whole object (its body ended there).
    pub complete: bool,
    /// The answer's `Content-Length`, where it gave one.
    pub stated: Option<u64>,
    pub etag: Option<String>,
}

/// The state of one [`keeping`] call.
struct Keep {
    keep: usize,
    moved: Moved,
    answer: Option<WholeAnswer>,
}

tokio::task_local! {
    /// Where the connector leaves a whole answer, inside [`keeping`].
    static KEEP: RefCell<Keep>;
}

/// Runs `request`, keeping the first `keep` bytes of a `200` answer to a ranged request
/// (the rest unread), counted into `moved` as they arrive.
pub(crate) async fn keeping<T>(
    keep: usize,
    moved: Moved,
    request: impl Future<Output = T>,
) -> (T, Option<WholeAnswer>) {
    let state = Keep {
        keep,
        moved,
        answer: None,
    };
    KEEP.scope(RefCell::new(state), async {
        let out = request.await;
        let answer = KEEP.with(|k| k.borrow_mut().answer.take());
        (out, answer)
    })
    .await
}

/// The first `keep` bytes of `body`, and whether they are all of it; `None` where it
/// ended other than it said (`stated`).
async fn first_bytes(
    body: object_store::client::HttpResponseBody,
    keep: usize,
    stated: Option<u64>,
    moved: &Moved,
) -> Result<Option<(Vec<u8>, bool)>, HttpError> {
    // Never sized from the stated length: at most what was asked.
    let mut bytes =
        Vec::with_capacity(keep.min(stated.map_or(keep, |s| usize::try_from(s).unwrap_or(keep))));
    let mut received = 0u64;
    let mut stream = body.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        moved.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        received += chunk.len() as u64;
        let room = keep.saturating_sub(bytes.len());
        bytes.extend_from_slice(chunk.get(..room).unwrap_or(&chunk));
        // Past what was asked, or at it with more to follow: the rest is not read.
        let more_said = stated.is_some_and(|s| s > received);
        if received > keep as u64 || (received == keep as u64 && more_said) {
            return Ok(Some((bytes, false)));
        }
    }
    Ok(stated
        .is_none_or(|s| s == received)
        .then_some((bytes, true)))
}

/// `object_store`'s HTTP client, keeping a whole answer inside [`keeping`].
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct KeepWhole;

impl HttpConnector for KeepWhole {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Service { inner }))
    }
}

#[derive(Debug)]
struct Service {
    inner: HttpClient,
}

/// The future of one call, as `HttpService` (an `async_trait`) has it.
type Call<'a> = Pin<Box<dyn Future<Output = Result<HttpResponse, HttpError>> + Send + 'a>>;

impl HttpService for Service {
    fn call<'life0, 'async_trait>(&'life0 self, request: HttpRequest) -> Call<'async_trait>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            let ranged = request.headers().contains_key("range");
            let response = self.inner.execute(request).await?;
            let keep = KEEP.try_with(|k| {
                let k = k.borrow();
                (k.keep, std::sync::Arc::clone(&k.moved))
            });
            let (Ok((keep, moved)), true) = (keep, ranged && response.status().as_u16() == 200)
            else {
                return Ok(response);
            };
            let stated = response
                .headers()
                .get("content-length")
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            let (parts, body) = response.into_parts();
            let etag = parts
                .headers
                .get("etag")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            if let Some((bytes, complete)) = first_bytes(body, keep, stated, &moved).await? {
                let answer = WholeAnswer {
                    bytes,
                    complete,
                    stated,
                    etag,
                };
                let _ = KEEP.try_with(|k| k.borrow_mut().answer = Some(answer));
            }
            Ok(HttpResponse::from_parts(parts, Vec::new().into()))
        })
    }
}
