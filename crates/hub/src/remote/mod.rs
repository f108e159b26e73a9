//! Remote sources (feature `remote`): checkpoints read by ranged requests from object stores, HTTP servers and the Hugging Face hub.

pub(crate) mod checkpoint;
pub(crate) mod error;
pub(crate) mod hub;
pub(crate) mod landing;
pub(crate) mod location;
pub(crate) mod object;
pub(crate) mod store;
pub(crate) mod url;
pub(crate) mod watch;
mod whole;

#[cfg(test)]
mod tests;
