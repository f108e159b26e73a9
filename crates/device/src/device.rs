//! The `Device` seam, a slab of device memory per file, staging buffers, asynchronous copies and their completion, with its contract; the staging ring's defaults.

use std::io;

/// The staging buffers of a load to a device, by default.
///
/// NOTE: two buffers fill while one or two copy; with 4 the stand-in's
/// loads stayed within 1.11x of the slower of their reads and copies, warm
/// and on the FUSE mount (BENCHMARKS.md, "Weights to a device").
pub const STAGING_BUFFERS: usize = 4;

/// The size of one staging buffer, and so the most one copy moves, by
/// default.
///
/// NOTE: 32 MiB copies keep a GPU's copy engine near its bandwidth while a
/// 2-4 buffer ring stays small (pegainfer's measurements, issue 53).
pub const STAGING_BYTES: usize = 32 << 20;

/// A device whose memory the crate's readers fill: device memory for each
/// file's tensors, staging buffers in host memory the device copies from,
/// and asynchronous copies out of them. The crate implements it for a CPU
/// stand-in ([`StandIn`](crate::StandIn), what the tests use) and, with the feature `cuda`,
/// for an NVIDIA GPU (`Cuda`); an engine may implement it for its own.
///
/// # Contract
///
/// - [`allocate`](Self::allocate)`(len)` gives device memory of at least
///   `len` bytes (`len > 0`) for one file's tensors: a slab. The crate places
///   each tensor at an offset that is a multiple of
///   [`alignment`](Self::alignment) (a power of two), copies only within
///   `0..len`, and drops the slab (which frees it) only once no copy into it
///   is in flight. [`address`](Self::address) is the device address of its
///   first byte, the same for its whole life.
/// - [`staging`](Self::staging)`(len)` gives a staging buffer: `len` bytes of
///   host memory the device copies from quickly (pinned memory, for a GPU),
///   which [`staging_bytes`](Self::staging_bytes) hands out, exactly `len`
///   of them. Between being given (or given back by `complete`) and being
///   submitted, only the crate touches those bytes, from several threads at
///   once, in disjoint parts.
/// - [`submit`](Self::submit)`(staging, len, slab, offset)` starts copying the
///   first `len` bytes of the buffer to `offset..offset + len` of the slab
///   and returns without waiting for it; the buffer belongs to the copy until
///   [`complete`](Self::complete) gives it back. Copies are submitted from
///   several threads at once, into the same slab too (never the same bytes).
/// - [`complete`](Self::complete) waits for one copy and gives its buffer
///   back, to be filled again. An error, there or from `submit`, means that
///   the bytes may not have arrived: the load fails (naming the file and
///   offset), waits for every copy still in flight, and drops every slab
///   and buffer it was given.
/// - Nothing blocks forever: a device that may hang bounds its waits and
///   fails instead.
///
/// Errors are [`io::Error`]s carrying the device's own message.
pub trait Device: Send + Sync {
    /// Device memory holding one file's tensors.
    type Slab: Send + Sync;
    /// A staging buffer in host memory.
    type Staging: Send;
    /// A copy in flight, holding its staging buffer.
    type Copy: Send;

    /// The device in words, for the report ("CUDA device 0 (NVIDIA H100)").
    fn name(&self) -> String;

    /// The alignment of every tensor in a slab, a power of two (256 unless
    /// the device says otherwise: CUDA's allocations and most kernels'
    /// vector loads need no more).
    fn alignment(&self) -> usize {
        256
    }

    /// Device memory of at least `len` bytes.
    fn allocate(&self, len: usize) -> io::Result<Self::Slab>;

    /// The device address of the slab's first byte.
    fn address(&self, slab: &Self::Slab) -> u64;

    /// A staging buffer of `len` bytes.
    fn staging(&self, len: usize) -> io::Result<Self::Staging>;

    /// The buffer's bytes, exactly the `len` it was made with.
    fn staging_bytes<'s>(&self, staging: &'s mut Self::Staging) -> &'s mut [u8];

    /// Starts copying `len` bytes of `staging` to `offset` of `slab`.
    fn submit(
        &self,
        staging: Self::Staging,
        len: usize,
        slab: &Self::Slab,
        offset: usize,
    ) -> io::Result<Self::Copy>;

    /// Waits for `copy` to complete; its buffer, to be filled again.
    fn complete(&self, copy: Self::Copy) -> io::Result<Self::Staging>;
}
