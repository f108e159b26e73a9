//! A checkpoint opened: its files resolved and opened once, their headers read and checked, each file's way of being read decided; the tensors known by name before any of their bytes is read.

pub(crate) mod open;
pub(crate) mod resolve;

pub(crate) use resolve::{Resolved, ShardFile, resolve};
