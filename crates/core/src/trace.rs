//! `tracing` events where the `tracing` feature is on, nothing where it is off: the crate's one switch for them.
//!
//! Events are written inside `traced` with `tracing`'s own macros; without
//! the feature the block is compiled out, so call sites carry no `cfg`.

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
