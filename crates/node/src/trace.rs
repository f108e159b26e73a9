//! `tracing` events where this crate's `tracing` feature is on, nothing where it is off.

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
