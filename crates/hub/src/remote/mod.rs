//! Remote sources (feature `remote`): checkpoints read by ranged requests from object stores, HTTP servers and the Hugging Face hub.
//!
//! - `url.rs`: the addresses (`s3://`, `gs://`, `az://`, `http(s)://`, `hf://`), parsed and
//!   shown without credentials;
//! - `hub.rs`: the hub's endpoint, token and resolve URLs, and its metadata headers;
//! - `store.rs`: `object_store` clients configured from the environment, and the runtime of
//!   the crate's own they run on;
//! - `location.rs`: a checkpoint's place, its files opened there (for `hf://`, at one commit);
//! - `checkpoint.rs`: the checkpoint found there (the named file, `model.safetensors` or the
//!   index), with the objects opened while finding it, for the open path;
//! - `object.rs`: one object, opened once, read by ranged GETs that require its ETag;
//! - `landing.rs`: a ranged body filling the caller's buffer, handed on as it arrives (to a
//!   cache that writes it);
//! - `error.rs`: the layer's error, scrubbed of credentials.
//!
//! A `RemoteObject` implements the crate's `Source` seam, so the read engine fills
//! destinations from it as from a local file, buffered.

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
