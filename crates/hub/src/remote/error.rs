//! The remote layer's error: what failed (a kind), on which address and byte range, with the cause's text scrubbed of every credential the layer knows; mapped onto the crate's `Error` by the open path.

use std::fmt;
use std::io;
use std::ops::Range;

use crate::error::RemoteFailure;

/// What went wrong: one of the crate's [`RemoteFailure`]s, or an address refused (`BadUrl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RemoteErrorKind {
    BadUrl,
    Config,
    NotFound,
    RepoNotFound,
    RevisionNotFound,
    Denied,
    Gated,
    Changed,
    Protocol,
    Failed,
    Unreachable,
    Stalled,
    Cancelled,
}

impl RemoteErrorKind {
    /// The words its error opens with, and the crate's kind of it.
    fn table(self) -> (&'static str, Option<RemoteFailure>) {
        use RemoteErrorKind as K;
        use RemoteFailure as F;
        match self {
            K::BadUrl => ("bad remote address", None),
            K::Config => ("cannot configure the store for", Some(F::Config)),
            K::NotFound => ("not found:", Some(F::FileNotFound)),
            K::RepoNotFound => ("no such repository:", Some(F::RepositoryNotFound)),
            K::RevisionNotFound => ("no such revision:", Some(F::RevisionNotFound)),
            K::Denied => ("access denied to", Some(F::Unauthorized)),
            K::Gated => ("access denied to a gated repository:", Some(F::Gated)),
            K::Changed => ("changed since it was opened:", Some(F::Changed)),
            K::Protocol => ("unexpected answer from", Some(F::Protocol)),
            K::Failed => ("failed to read", Some(F::Failed)),
            K::Unreachable => ("cannot reach", Some(F::Unreachable)),
            K::Stalled => ("no progress from", Some(F::Stalled)),
            K::Cancelled => ("cancelled while reading", Some(F::Cancelled)),
        }
    }

    fn failure(self) -> Option<RemoteFailure> {
        self.table().1
    }

    /// Whether the server gave no usable answer (a cache's ref may stand in for the hub's).
    pub(crate) fn unreached(self) -> bool {
        matches!(self, RemoteErrorKind::Unreachable | RemoteErrorKind::Failed)
    }

    /// The I/O kind a `Source::read_at` failure carries: the crate error's.
    fn io_kind(self) -> io::ErrorKind {
        self.failure()
            .map_or(io::ErrorKind::InvalidInput, RemoteFailure::io_kind)
    }
}

/// A remote operation that failed, on `url` (as shown), maybe on a byte range of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RemoteError {
    pub kind: RemoteErrorKind,
    pub url: String,
    pub range: Option<Range<u64>>,
    /// The cause in words, scrubbed (see [`Redactor`]).
    pub detail: String,
}

impl RemoteError {
    pub(crate) fn new(kind: RemoteErrorKind, url: impl Into<String>, detail: String) -> Self {
        Self {
            kind,
            url: url.into(),
            range: None,
            detail,
        }
    }

    pub(crate) fn with_range(mut self, range: Range<u64>) -> Self {
        self.range = Some(range);
        self
    }

    /// The crate's error: [`ErrorKind::Remote`](crate::ErrorKind::Remote), or
    /// [`ErrorKind::BadAddress`](crate::ErrorKind::BadAddress) for an address refused.
    pub(crate) fn into_error(self, operation: crate::error::Operation) -> crate::error::Error {
        match self.kind.failure() {
            Some(failure) => crate::error::Error::remote_failed(
                operation,
                self.url,
                self.range,
                failure,
                &self.detail,
            ),
            None => crate::error::Error::bad_address(self.url, self.detail),
        }
    }

    /// As an `io::Error` of the matching kind (for the `Source` seam).
    pub(crate) fn into_io(self) -> io::Error {
        io::Error::new(self.kind.io_kind(), self)
    }
}

impl fmt::Display for RemoteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind.table().0, self.url)?;
        if let Some(range) = &self.range {
            write!(f, " (bytes {}..{})", range.start, range.end)?;
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

impl std::error::Error for RemoteError {}

/// Removes known secrets from text that may quote a request (a presigned URL's query, a
/// URL's user information).
///
/// NOTE: causes are kept as scrubbed text, not `source()` errors: object_store and reqwest
/// errors print the URL, query included.
#[derive(Clone, Default)]
pub(crate) struct Redactor {
    secrets: Vec<String>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}

impl Redactor {
    /// Adds a secret; short ones (under 4 bytes) would scrub ordinary words: ignored.
    pub(crate) fn add(&mut self, secret: &str) {
        if secret.len() >= 4 && !self.secrets.iter().any(|s| s == secret) {
            self.secrets.push(secret.to_owned());
            // The longest first, so that a secret containing another goes whole.
            self.secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        }
    }

    /// The text of `error` and its causes, scrubbed.
    pub(crate) fn error_text(&self, error: &(dyn std::error::Error + 'static)) -> String {
        let mut text = error.to_string();
        let mut cause = error.source();
        while let Some(e) = cause {
            let more = e.to_string();
            // object_store's messages often repeat their cause's text already.
            if !text.contains(&more) {
                text.push_str(": ");
                text.push_str(&more);
            }
            cause = e.source();
        }
        self.scrub(&text)
    }

    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for secret in &self.secrets {
            text = text.replace(secret.as_str(), "<redacted>");
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_address_and_range_once() {
        let e = RemoteError::new(
            RemoteErrorKind::Failed,
            "s3://b/model.safetensors",
            "503 after 3 retries".into(),
        )
        .with_range(100..200);
        assert_eq!(
            e.to_string(),
            "failed to read s3://b/model.safetensors (bytes 100..200): 503 after 3 retries"
        );
        let io = RemoteError::new(RemoteErrorKind::NotFound, "hf://o/r", String::new()).into_io();
        assert_eq!(io.kind(), io::ErrorKind::NotFound);
        assert_eq!(io.to_string(), "not found: hf://o/r");
    }

    #[derive(Debug)]
    struct Outer(Inner);
    #[derive(Debug)]
    struct Inner;
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("request to http://h/x?sig=S3CR3T failed")
        }
    }
    impl fmt::Display for Inner {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("token hf_abcdef rejected")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
    impl std::error::Error for Inner {}

    #[test]
    fn the_redactor_scrubs_every_secret_of_the_chain() {
        let mut r = Redactor::default();
        r.add("sig=S3CR3T");
        r.add("hf_abcdef");
        r.add("ab"); // too short to scrub
        let text = r.error_text(&Outer(Inner));
        assert_eq!(
            text,
            "request to http://h/x?<redacted> failed: token <redacted> rejected"
        );
        assert!(!format!("{r:?}").contains("S3CR3T"));
    }
}
