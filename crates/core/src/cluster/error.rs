//! The exchange's error: what kind of failure, and a message that names the collective, the
//! node and the sizes involved.
//!
//! It is public only for the plug-in crates that implement the exchange (hidden from the docs):
//! the load maps it onto the crate's one `Error` (or onto a fallback to local reads with its
//! reason), as the remote layer's error is.

/// What went wrong in an exchange.
// Hidden on the item itself: the facade inlines `cluster`, and the attribute of a `use`
// does not reach the pages it makes there.
#[doc(hidden)] // for the plug-in crates
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
// Setup, TimedOut and Broken come from the plug-in crates' exchanges and the tests' loopback.
pub enum ExchangeErrorKind {
    /// The exchange could not be set up: the system's library (MPI) missing or initialized
    /// without the thread support it needs, a node identity that does not parse, nodes that
    /// disagree on how they are identified, a bad timeout.
    Setup,
    /// A collective did not complete within the deadline: a node stalled or died.
    TimedOut,
    /// An earlier collective timed out (or the exchange's thread ended): the nodes' order of
    /// collectives is lost, so every later call is refused.
    Broken,
    /// A received range is not what its owner sent: the digest the owner computed differs from
    /// the one of the bytes received.
    Corrupt,
    /// The call breaks the contract: an owner out of range, nodes that called different
    /// collectives or lengths at the same place in their order, a size the transport cannot
    /// carry.
    Usage,
}

/// A failed exchange: its kind, and this layer's message (lowercase, no trailing period).
#[doc(hidden)] // for the plug-in crates
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ExchangeError {
    kind: ExchangeErrorKind,
    message: String,
}

impl ExchangeError {
    /// An error of `kind` saying `message`.
    pub fn new(kind: ExchangeErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// What went wrong, for callers that decide by it (a fallback, a retry, an abort).
    pub fn kind(&self) -> ExchangeErrorKind {
        self.kind
    }
}
