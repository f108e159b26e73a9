//! The exchange's error: what kind of failure, and a message that names the collective, the
//! node and the sizes involved (public for the plug-in crates; the load maps it onto `Error`).

/// What went wrong in an exchange.
#[doc(hidden)] // for the plug-in crates (on the item: the facade inlines `cluster`)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeErrorKind {
    /// The exchange could not be set up (MPI missing, a bad node identity or timeout).
    Setup,
    /// A collective did not complete within the deadline: a node stalled or died.
    TimedOut,
    /// An earlier collective timed out: the nodes' order is lost, every later call refused.
    Broken,
    /// A received range is not what its owner sent (by its digest).
    Corrupt,
    /// The call breaks the contract: an owner out of range, nodes whose calls differ, a size
    /// the transport cannot carry.
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
