//! A server that ignores `Range`: the whole object its first answer carries is kept for the open, not dropped, so that such a file costs one request.
//!
//! `object_store` answers a ranged GET that came back `200` with an error
//! and drops the body, the whole object, unread; the open would then need a
//! `HEAD` for the length and a second whole GET (three requests and two
//! copies of each file on the wire, measured with `python3 -m http.server`:
//! 9 GETs and 4 HEADs for 4 files). Every store client of the layer is
//! built on [`KeepWhole`], the `object_store` HTTP client with one step
//! more: inside [`keeping`] (the open's first request), a ranged request
//! answered `200` with a `Content-Length` has its body read to the end and
//! kept, and `object_store` gets the answer without its body (and fails it
//! as before). Outside [`keeping`], and for every other answer, nothing
//! changes. The length such an answer states is the server's word: past the
//! cap [`keeping`] is given the body is refused unread, and below it the
//! body is kept as its bytes arrive, never reserved from the stated length.
//!
//! NOTE: the hook is `object_store`'s own seam for HTTP clients
//! (`HttpConnector`, `HttpService`): the request and its retries stay the
//! client's, and no second HTTP stack is added for one rare answer.

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

/// The whole object a server sent for a ranged request, and its ETag.
#[derive(Debug)]
pub(crate) struct WholeBody {
    pub body: Vec<u8>,
    pub etag: Option<String>,
}

/// What became of a whole answer to the request [`keeping`] ran.
#[derive(Debug)]
pub(crate) enum Whole {
    /// None came (the range was honoured, or the answer failed otherwise).
    None,
    /// Kept.
    Kept(WholeBody),
    /// Refused unread: it stated this many bytes, more than the cap.
    TooLarge(u64),
}

/// The state of one [`keeping`] call.
struct Keep {
    cap: u64,
    moved: Moved,
    whole: Whole,
}

tokio::task_local! {
    /// Where the connector leaves a whole answer, inside [`keeping`].
    static KEEP: RefCell<Keep>;
}

/// Runs `request`, keeping the whole object a server answers a ranged
/// request of it with (`200` for a `Range`) instead of dropping it, where it
/// states at most `cap` bytes; its bytes are counted into `moved` as they
/// arrive.
pub(crate) async fn keeping<T>(
    cap: u64,
    moved: Moved,
    request: impl Future<Output = T>,
) -> (T, Whole) {
    let keep = Keep {
        cap,
        moved,
        whole: Whole::None,
    };
    KEEP.scope(RefCell::new(keep), async {
        let out = request.await;
        let whole = KEEP.with(|k| std::mem::replace(&mut k.borrow_mut().whole, Whole::None));
        (out, whole)
    })
    .await
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
            let len = response
                .headers()
                .get("content-length")
                .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
            let keep = KEEP.try_with(|k| {
                let k = k.borrow();
                (k.cap, std::sync::Arc::clone(&k.moved))
            });
            let (Ok((cap, moved)), true) = (keep, ranged && response.status().as_u16() == 200)
            else {
                return Ok(response);
            };
            let Some(len) = len else {
                return Ok(response);
            };
            let (parts, body) = response.into_parts();
            if len as u64 > cap {
                // Refused unread: the body is dropped with its connection.
                let _ = KEEP.try_with(|k| k.borrow_mut().whole = Whole::TooLarge(len as u64));
                return Ok(HttpResponse::from_parts(parts, Vec::new().into()));
            }
            let etag = parts
                .headers
                .get("etag")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            // Grown as bytes arrive, never reserved from the stated length.
            let mut bytes = Vec::new();
            let mut stream = body.bytes_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                if bytes.len() + chunk.len() > len {
                    // More than it said: nothing kept, the open asks again.
                    return Ok(HttpResponse::from_parts(parts, Vec::new().into()));
                }
                moved.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                bytes.extend_from_slice(&chunk);
            }
            if bytes.len() == len {
                let kept = WholeBody { body: bytes, etag };
                let _ = KEEP.try_with(|k| k.borrow_mut().whole = Whole::Kept(kept));
            }
            Ok(HttpResponse::from_parts(parts, Vec::new().into()))
        })
    }
}
