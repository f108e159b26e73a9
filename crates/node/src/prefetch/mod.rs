//! Page-cache warming before a load: the local ranks of a job stream a checkpoint's bytes into the page cache through one shared chunk queue, skipping what is resident and staying within the memory guard.
//!
//! # How the work is shared
//!
//! The files are cut into chunks (8 MiB by default) in checkpoint order
//! (`plan.rs`). The local ranks of a job (the processes of one node:
//! `LOCAL_RANK` / `LOCAL_WORLD_SIZE` and their Slurm and MPI equivalents,
//! `extras/local_rank.rs`) share one queue of chunk states, a small file in `/dev/shm`
//! that every rank maps (`queue.rs` for its words, `queue_file.rs` for the
//! file). Each of a rank's `streams` readers starts at its own byte offset
//! (the checkpoint's bytes split evenly over ranks × streams, never by global
//! rank, so every node warms every byte) and claims free chunks onward with a
//! compare-and-swap, so a rank that finishes early goes on with the chunks
//! of a slower one and no chunk is read twice on a node. When no chunk is
//! free, a reader takes over the chunks of claimers that have died
//! (`coord/owner.rs`) or stopped (below), and waits for those of the others
//! (`worker.rs`).
//!
//! The first rank creates the queue file, checks residency and applies the
//! memory guard while holding its lock, then publishes it; the others
//! validate what they find and replace a file that fails, or that no live
//! rank is attached to (a stale file from an earlier run). The last live
//! rank to leave removes it.
//!
//! Residency is checked before each chunk is read (`residency.rs`), so a
//! stale "done" costs nothing but a check, and after a rank's chunks are done
//! it checks what landed and reads what did not, once.
//!
//! Readers are threads of the crate's worker pool, like the read engine's:
//! they block on storage. They do not go through the read engine itself,
//! which runs a list of jobs fixed in advance, because here a chunk is only
//! known to be this rank's when its claim succeeds.
//!
//! # When a rank stops
//!
//! A rank that is stopped (`SIGSTOP`, a debugger, a cgroup freezer, a node
//! short of memory) keeps the chunks it claimed, but not for long: every
//! rank beats a heartbeat in the queue as its readers make progress, and a
//! rank that has nothing left to claim takes over a chunk whose holder's
//! heartbeat has not moved for `clamp(8 × t, 500 ms, 2 s)`, `t` being the
//! mean time the taking rank needed to read a chunk (2 s before it has read
//! one). A chunk is taken over this way at most once, so at worst it is
//! read twice; the stopped rank, resumed, finds its claims gone and carries
//! on. A healthy read is never taken over: a chunk of 8 MiB reads in tens
//! of milliseconds, and a rank beats at every chunk and, while it waits,
//! every 2 ms. Whatever this rule leaves (a holder that keeps beating but
//! never finishes, a rank past the queue's 256 slots) waits for the 60 s
//! stall guard, then is reported as not warmed. The details and the
//! measurements behind the numbers are in `takeover.rs`.
//!
//! # Where the pieces are
//!
//! The loader (`Loader::load`, `Loader::warm`, and `safeload::prefetch`
//! through it) opens the files once and hands them over (`load.rs`), with
//! the policy's answer to whether to run (`policy/prefetch.rs`); `run.rs`
//! plans the chunks once, opens the queue and hands the readers
//! (`worker.rs`) their start offsets; each chunk is warmed by `warm.rs`;
//! `options/prefetch.rs` holds the public builder.

mod claims;
mod fill;
mod load;
mod plan;
mod queue;
mod queue_file;
mod residency;
mod run;
mod takeover;
mod warm;
mod worker;

pub(crate) use fill::{FillOutcome, SharedQueue, fill_shared};
pub(crate) use load::{before_load, warm};
