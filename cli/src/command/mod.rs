//! The subcommands, one file each: each builds its library call from the arguments, runs it, and prints the result.

pub mod cache;
pub mod inspect;
pub mod load;
pub mod mounts;
pub mod prefetch;
