//! Page-cache warming before a load: the local ranks of a job stream a checkpoint's bytes into the page cache through one shared chunk queue, skipping what is resident and staying within the memory guard.
//!
//! The files are cut into chunks (8 MiB by default, `plan.rs`). The local
//! ranks share one queue of chunk states, a small file in `/dev/shm` every
//! rank maps (`queue.rs`, `queue_file.rs`). Each reader starts at its own
//! byte offset (the bytes split over ranks × streams, never by global rank,
//! so every node warms every byte) and claims free chunks onward by
//! compare-and-swap: a rank that finishes early takes a slower one's chunks,
//! and no chunk is read twice on a node. With nothing free, a reader takes
//! over the chunks of dead or stopped holders (`takeover.rs`) and waits for
//! the others (`worker.rs`); a chunk whose holder keeps beating but never
//! finishes is given up after the 60 s stall guard and reported.
//!
//! Residency is checked before each chunk is read (`residency.rs`), so a
//! stale "done" costs only a check; a rank checks what landed at the end and
//! reads what did not, once. Readers are threads of the read loop
//! (`jobs::drain`), not the read engine, whose list of jobs is fixed in
//! advance: here a chunk is this rank's only once its claim succeeds.

mod claims;
mod load;
mod plan;
mod queue;
mod queue_file;
mod residency;
mod run;
mod takeover;
mod warm;
mod worker;

// The chunk queue and its readers, which the node copy's fill runs too.
pub(crate) use load::{before_load, warm};
pub(crate) use plan::{Chunk, ChunkPlan, guard, reader_plan};
pub(crate) use queue::{DONE, Layout, chunk_words, init_from_header};
pub(crate) use queue_file::Queue;
pub(crate) use queue_file::is_stale;
pub(crate) use worker::{Sink, Work};
