//! Why a remote request failed, as data an engine branches on (`RemoteFailure`), and the constructors of the crate's remote errors.

use std::fmt;
use std::io;
use std::path::PathBuf;

use super::{Error, ErrorKind, Operation};

/// Why a remote checkpoint's request failed ([`ErrorKind::Remote`]), as data an engine branches
/// on (ask for a token, retry later, go offline). New kinds may be added; `Display` gives the
/// words the error's message opens with.
///
/// ```
/// use safeload::RemoteFailure;
///
/// /// What an engine does next when its weights cannot be had.
/// fn next_step(err: &safeload::Error) -> &'static str {
///     match err.remote_failure() {
///         Some(RemoteFailure::RepositoryNotFound | RemoteFailure::RevisionNotFound) => {
///             "check the model's name and revision"
///         }
///         Some(RemoteFailure::Unauthorized | RemoteFailure::Gated) => "set HF_TOKEN",
///         Some(RemoteFailure::OfflineNotCached) => "unset HF_HUB_OFFLINE, or download first",
///         Some(RemoteFailure::Unreachable | RemoteFailure::Stalled) => "retry later",
///         Some(_) => "report it",
///         None if err.is_not_found() => "download it first",
///         None => "report it",
///     }
/// }
///
/// let err = safeload::load_state_dict("/no/such/checkpoint", None).unwrap_err();
/// assert_eq!(next_step(&err), "download it first");
/// assert_eq!(RemoteFailure::Gated.as_str(), "gated");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RemoteFailure {
    /// The hub has no such repository (also a private one the token cannot see).
    RepositoryNotFound,
    /// The repository has no such revision: branch, tag or commit.
    RevisionNotFound,
    /// No such file of the repository at the commit, or object of a store or server (404).
    FileNotFound,
    /// The credentials (`HF_TOKEN`, `AWS_*`) do not allow it, or none were given (401, 403).
    Unauthorized,
    /// The repository is gated: its terms are to be accepted on the hub by the token's account.
    Gated,
    /// `HF_HUB_OFFLINE=1` forbids asking the hub, and the hub cache lacks what the load needs.
    OfflineNotCached,
    /// The hub cannot be reached: refused, not resolved, or no answer in time (a cache with the
    /// revision's ref is used instead, where there is one).
    Unreachable,
    /// An answer stopped moving (`SAFELOAD_REMOTE_STALL_SECS`), and so did its retry.
    Stalled,
    /// Every retry failed (5xx, resets, short bodies, timeouts of a store).
    Failed,
    /// The object is not the version opened (`If-Match` refused, another length or commit).
    Changed,
    /// The server answered other than it must (no commit named, another body, too many bytes).
    Protocol,
    /// The load was cancelled while the request was in flight.
    Cancelled,
    /// The client of the store could not be set up from the environment.
    Config,
    /// Not something this build or call does (a remote address without the feature `remote`,
    /// `?with=` with the hub cache off, a remote checkpoint given to `warm`).
    Unsupported,
}

impl RemoteFailure {
    /// A stable code to log or branch on: the variant's name in `snake_case`.
    pub fn as_str(self) -> &'static str {
        self.table().0
    }

    /// The code, the words, and the I/O kind [`Error::io_error`] carries.
    fn table(self) -> (&'static str, &'static str, io::ErrorKind) {
        use io::ErrorKind as Io;
        match self {
            RemoteFailure::RepositoryNotFound => {
                ("repository_not_found", "repository not found", Io::NotFound)
            }
            RemoteFailure::RevisionNotFound => {
                ("revision_not_found", "revision not found", Io::NotFound)
            }
            RemoteFailure::FileNotFound => ("file_not_found", "not found", Io::NotFound),
            RemoteFailure::Unauthorized => ("unauthorized", "access denied", Io::PermissionDenied),
            RemoteFailure::Gated => (
                "gated",
                "access denied to a gated repository",
                Io::PermissionDenied,
            ),
            RemoteFailure::OfflineNotCached => (
                "offline_not_cached",
                "not in the hub cache, and HF_HUB_OFFLINE=1 forbids asking the hub",
                Io::NotFound,
            ),
            RemoteFailure::Unreachable => {
                ("unreachable", "the server cannot be reached", Io::Other)
            }
            RemoteFailure::Stalled => ("stalled", "the server stalled", Io::TimedOut),
            RemoteFailure::Failed => ("failed", "request failed", Io::Other),
            RemoteFailure::Changed => (
                "changed",
                "the object changed since it was opened",
                Io::Other,
            ),
            RemoteFailure::Protocol => ("protocol", "unexpected answer", Io::Other),
            RemoteFailure::Cancelled => ("cancelled", "cancelled", Io::Interrupted),
            RemoteFailure::Config => ("config", "cannot configure the store", Io::InvalidInput),
            RemoteFailure::Unsupported => ("unsupported", "not supported", Io::Unsupported),
        }
    }

    /// The kind of a failure known only by its I/O kind.
    fn of_io_kind(kind: io::ErrorKind) -> RemoteFailure {
        use io::ErrorKind as Io;
        match kind {
            Io::NotFound => RemoteFailure::FileNotFound,
            Io::PermissionDenied => RemoteFailure::Unauthorized,
            Io::InvalidData => RemoteFailure::Protocol,
            Io::TimedOut => RemoteFailure::Stalled,
            Io::Interrupted => RemoteFailure::Cancelled,
            Io::InvalidInput | Io::Unsupported => RemoteFailure::Unsupported,
            _ => RemoteFailure::Failed,
        }
    }

    /// The I/O kind [`Error::io_error`] carries for it.
    pub fn io_kind(self) -> io::ErrorKind {
        self.table().2
    }

    /// Whether something asked for does not exist ([`Error::is_not_found`]).
    pub(super) fn is_not_found(self) -> bool {
        self.io_kind() == io::ErrorKind::NotFound
    }
}

impl fmt::Display for RemoteFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.table().1)
    }
}

impl Error {
    /// Why a remote request failed, for [`ErrorKind::Remote`]; `None` for every other kind
    /// ([`ErrorKind::BadAddress`] included).
    pub fn remote_failure(&self) -> Option<RemoteFailure> {
        match &self.0.kind {
            ErrorKind::Remote { failure, .. } => Some(*failure),
            _ => None,
        }
    }

    /// A remote failure on `url`: its reason the failure's words, then `detail`, if any.
    pub fn remote_failed(
        operation: Operation,
        url: impl Into<PathBuf>,
        range: Option<std::ops::Range<u64>>,
        failure: RemoteFailure,
        detail: &str,
    ) -> Error {
        let reason = if detail.is_empty() {
            failure.to_string()
        } else {
            format!("{failure}: {detail}")
        };
        Error::remote_with(operation, url.into(), range, failure, reason)
    }

    /// A remote failure known by its I/O kind, `reason` its whole message.
    pub fn remote(
        operation: Operation,
        url: impl Into<PathBuf>,
        range: Option<std::ops::Range<u64>>,
        reason: String,
        kind: io::ErrorKind,
    ) -> Error {
        let failure = RemoteFailure::of_io_kind(kind);
        Error::remote_with(operation, url.into(), range, failure, reason)
    }

    fn remote_with(
        operation: Operation,
        url: PathBuf,
        range: Option<std::ops::Range<u64>>,
        failure: RemoteFailure,
        reason: String,
    ) -> Error {
        let source = io::Error::new(failure.io_kind(), reason.clone());
        let kind = ErrorKind::Remote {
            operation,
            range,
            failure,
            reason,
        };
        Error::make(kind, Some(url), Some(source))
    }

    /// An address the crate does not read; `shown` is the address without credentials.
    pub fn bad_address(shown: impl Into<PathBuf>, reason: impl Into<String>) -> Error {
        let reason = reason.into();
        Error::new(ErrorKind::BadAddress { reason }, shown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY: [RemoteFailure; 14] = [
        RemoteFailure::RepositoryNotFound,
        RemoteFailure::RevisionNotFound,
        RemoteFailure::FileNotFound,
        RemoteFailure::Unauthorized,
        RemoteFailure::Gated,
        RemoteFailure::OfflineNotCached,
        RemoteFailure::Unreachable,
        RemoteFailure::Stalled,
        RemoteFailure::Failed,
        RemoteFailure::Changed,
        RemoteFailure::Protocol,
        RemoteFailure::Cancelled,
        RemoteFailure::Config,
        RemoteFailure::Unsupported,
    ];

    #[test]
    fn each_failure_has_its_own_code_and_words() {
        fn assert_plain_data<T: Send + Sync + Copy + 'static>() {}
        assert_plain_data::<RemoteFailure>();
        let codes: std::collections::BTreeSet<_> = EVERY.iter().map(|f| f.as_str()).collect();
        let words: std::collections::BTreeSet<_> = EVERY.iter().map(|f| f.to_string()).collect();
        assert_eq!((codes.len(), words.len()), (EVERY.len(), EVERY.len()));
        for failure in EVERY {
            let code = failure.as_str();
            assert!(code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'));
            // The code is the variant's name in snake_case.
            let name = format!("{failure:?}").to_ascii_lowercase();
            assert_eq!(code.replace('_', ""), name, "{failure:?}");
        }
    }

    #[test]
    fn what_is_missing_is_not_found_and_the_rest_is_not() {
        let missing = [
            RemoteFailure::RepositoryNotFound,
            RemoteFailure::RevisionNotFound,
            RemoteFailure::FileNotFound,
            RemoteFailure::OfflineNotCached,
        ];
        for failure in EVERY {
            let e = Error::remote_failed(Operation::Open, "hf://o/r", None, failure, "x");
            assert_eq!(e.is_not_found(), missing.contains(&failure), "{failure:?}");
            assert_eq!(e.remote_failure(), Some(failure));
            assert!(!e.is_corrupt());
        }
        let denied =
            Error::remote_failed(Operation::Open, "s3://b/k", None, RemoteFailure::Gated, "");
        let io = denied.io_error().map(io::Error::kind);
        assert_eq!(io, Some(io::ErrorKind::PermissionDenied));
    }

    #[test]
    fn the_message_says_the_address_the_failure_and_the_detail_once() {
        let e = Error::remote_failed(
            Operation::Open,
            "hf://acme/model@main/model.safetensors",
            None,
            RemoteFailure::RepositoryNotFound,
            "HTTP 404 RepoNotFound",
        );
        assert_eq!(
            e.to_string(),
            "hf://acme/model@main/model.safetensors: remote error while opening: \
             repository not found: HTTP 404 RepoNotFound"
        );
        let e = Error::remote_failed(
            Operation::Read,
            "s3://b/k",
            Some(4..8),
            RemoteFailure::Changed,
            "",
        );
        assert_eq!(
            e.to_string(),
            "s3://b/k: remote error while reading (bytes 4..8): the object changed since it was opened"
        );
    }

    #[test]
    fn an_io_kind_gives_the_failure_it_stands_for() {
        let of = |kind| {
            Error::remote(Operation::Open, "x", None, "why".into(), kind)
                .remote_failure()
                .unwrap()
        };
        assert_eq!(of(io::ErrorKind::NotFound), RemoteFailure::FileNotFound);
        assert_eq!(
            of(io::ErrorKind::PermissionDenied),
            RemoteFailure::Unauthorized
        );
        assert_eq!(of(io::ErrorKind::InvalidData), RemoteFailure::Protocol);
        assert_eq!(of(io::ErrorKind::Unsupported), RemoteFailure::Unsupported);
        assert_eq!(of(io::ErrorKind::ConnectionReset), RemoteFailure::Failed);
        // The reason is the caller's, whole.
        let e = Error::remote(
            Operation::Open,
            "x",
            None,
            "why".into(),
            io::ErrorKind::Other,
        );
        assert_eq!(e.to_string(), "x: remote error while opening: why");
    }

    #[test]
    fn a_bad_address_names_it_and_is_no_remote_failure() {
        let e = Error::bad_address("hf://acme/bad--name", "no -- in a name");
        assert_eq!(e.path(), Some(std::path::Path::new("hf://acme/bad--name")));
        assert_eq!(e.remote_failure(), None);
        assert!(matches!(e.kind(), ErrorKind::BadAddress { .. }));
        assert_eq!(
            e.to_string(),
            "hf://acme/bad--name: bad remote address: no -- in a name"
        );
    }
}
