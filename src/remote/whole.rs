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
//! changes.
//!
//! NOTE: the hook is `object_store`'s own seam for HTTP clients
//! (`HttpConnector`, `HttpService`): the request and its retries stay the
//! client's, and no second HTTP stack is added for one rare answer.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;

use futures_util::StreamExt;
use object_store::ClientOptions;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};

/// The whole object a server sent for a ranged request, and its ETag.
#[derive(Debug)]
pub(crate) struct Kept {
    pub body: Vec<u8>,
    pub etag: Option<String>,
}

tokio::task_local! {
    /// Where the connector leaves a whole answer, inside [`keeping`].
    static KEPT: RefCell<Option<Kept>>;
}

/// Runs `request`, keeping the whole object a server answers a ranged
/// request of it with (`200` for a `Range`) instead of dropping it.
pub(crate) async fn keeping<T>(request: impl Future<Output = T>) -> (T, Option<Kept>) {
    KEPT.scope(RefCell::new(None), async {
        let out = request.await;
        let kept = KEPT.with(|k| k.borrow_mut().take());
        (out, kept)
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
            let wanted =
                ranged && response.status().as_u16() == 200 && KEPT.try_with(|_| ()).is_ok();
            let Some(len) = len.filter(|_| wanted) else {
                return Ok(response);
            };
            let (parts, body) = response.into_parts();
            let etag = parts
                .headers
                .get("etag")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            // The length is the server's word: reserved up to 64 MiB, grown as
            // bytes arrive, and never past it.
            let mut bytes = Vec::with_capacity(len.min(64 << 20));
            let mut stream = body.bytes_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                if bytes.len() + chunk.len() > len {
                    // More than it said: nothing kept, the open asks again.
                    return Ok(HttpResponse::from_parts(parts, Vec::new().into()));
                }
                bytes.extend_from_slice(&chunk);
            }
            if bytes.len() == len {
                let kept = Kept { body: bytes, etag };
                let _ = KEPT.try_with(|k| *k.borrow_mut() = Some(kept));
            }
            Ok(HttpResponse::from_parts(parts, Vec::new().into()))
        })
    }
}
