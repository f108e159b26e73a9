//! The crate's integration tests, one module per subject, in one test binary:
//! `tests/common` is compiled once, and `cargo test` links one executable
//! instead of twenty.
//!
//! Run one subject with a filter on its module: `cargo test --test it
//! malformed::`. The modules of the optional features are compiled with them:
//! `cargo test --features candle,tracing,serde --test it candle:: tracing:: report_json::`.
//!
//! The modules share one process, and its tests run beside each other:
//!
//! - A test that spawns this binary again (`common::child`) names its own
//!   module's `child` test (`child_command(module_path!(), ..)`), so that
//!   roles of different modules never meet.
//! - What is global to the process is changed or measured in a child process
//!   that runs one test (the environment: `environment`, `prefetch`; the
//!   largest allocation: `malformed::allocation_watch`; peak memory and bytes
//!   read: `stream`; cgroups: `limits`, `stream`), or under a lock that every
//!   test touching it takes (the stream's reader threads, which `stream`
//!   counts by name: `common::streaming`).

#[path = "../common/mod.rs"]
mod common;

mod api;
mod async_load;
mod checkpoint;
mod cluster;
mod contract;
mod convert_load;
mod device;
mod environment;
mod fuse_faults;
mod fuse_partial;
mod fuse_policy;
mod fuse_prefetch_ranks;
mod limits;
mod load;
mod malformed;
mod node_copy;
mod one_version;
mod policy;
mod prefetch;
mod progress;
mod properties;
mod short_reads;
mod slice;
mod stream;
mod verify;

#[cfg(feature = "candle")]
mod candle;
#[cfg(feature = "candle-cuda")]
mod candle_cuda;
#[cfg(feature = "cuda")]
mod device_cuda;
#[cfg(feature = "remote")]
mod hub_cache;
#[cfg(feature = "remote")]
mod remote;
#[cfg(feature = "serde")]
mod report_json;
#[cfg(feature = "tracing")]
mod tracing;
