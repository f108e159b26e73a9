//! `tracing` events where the `tracing` feature is on, nothing where it is off: the crate's one switch for them.
//!
//! Code that emits events is written inside `traced`, with `tracing`'s own
//! macros; without the feature the block is compiled out (its expressions
//! are not evaluated), so call sites carry no `cfg`. Events: each file's
//! strategy and why, and the load's totals (debug, info); prefetch decisions
//! (info); `warn` only where the caller should act.

/// The block, where the `tracing` feature is on.
macro_rules! traced {
    ($($code:tt)*) => {
        #[cfg(feature = "tracing")]
        {
            $($code)*
        }
    };
}

pub(crate) use traced;
