//! What a report says beside its figures, as data: why a prefetch ran, how the reads in flight were found, what a load, its queue or its node copy met or did otherwise (`Note`), each with a stable code and its words.

use std::fmt;
use std::path::PathBuf;

use super::human_bytes;
use crate::adapt::{SettleReason, Settled};
use crate::mount::Mount;
use crate::workers::Started;

/// One thing a report says beside its figures, as data: `Display` gives the
/// words, [`as_str`](Self::as_str) a stable code (the JSON's `code`).
///
/// One type for every such field, each holding its own variants (listed
/// under each heading below): [`LoadReport::notes`](super::LoadReport::notes)
/// and a node copy's remarks say what went otherwise than planned,
/// [`PrefetchReport::reason`](super::PrefetchReport::reason) why a prefetch
/// ran or not, [`PrefetchReport::queue_note`](super::PrefetchReport::queue_note)
/// what became of the shared queue,
/// [`LoadReport::io_concurrency_reason`](super::LoadReport::io_concurrency_reason)
/// how the reads in flight were found.
///
/// ```
/// use safeload::report::Note;
///
/// let note = Note::RangesIgnored { files: 4 };
/// assert_eq!(note.as_str(), "ranges_ignored");
/// assert_eq!(note.to_string(), "the server ignores Range: each file fetched whole (4 files)");
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Note {
    // A load's notes.
    /// The OS refused threads (`RLIMIT_NPROC`, a cgroup's `pids.max`):
    /// `started` of `requested` ran, the calling one included, for `work`
    /// (`"opening files"` or `"reading"`).
    ThreadsRefused {
        /// What the threads were for.
        work: &'static str,
        /// Threads that ran.
        started: usize,
        /// Threads asked for.
        requested: usize,
        /// The OS's answer to the first one refused.
        error: String,
    },
    /// A remote server answered a ranged request with the whole object:
    /// each of these `files` was fetched whole, once, by its first request.
    RangesIgnored {
        /// Files fetched whole.
        files: usize,
    },
    /// The nodes of a job read each byte once between them: this `node` of
    /// `nodes` read `read` of the `total` bytes exchanged from storage and
    /// received the rest, each range's SHA-256 checked.
    ReadOncePerCluster {
        /// This node's index.
        node: usize,
        /// The job's nodes.
        nodes: usize,
        /// Bytes this node read from storage.
        read: u64,
        /// Bytes of the exchange.
        total: u64,
    },
    /// The nodes of a job could not split the reads, and each read alone.
    NodesReadAlone {
        /// Why, e.g. `node 2 sees another version of model.safetensors`.
        why: String,
    },

    // A prefetch's reason.
    /// [`Loader::prefetch`](crate::Loader::prefetch) asked for it (or
    /// [`Loader::warm`](crate::Loader::warm) ran it).
    PrefetchRequested {
        /// Readers per process.
        streams: usize,
    },
    /// An environment variable asked for it (`SAFELOAD_PREFETCH`, else
    /// `HF_SHARD_PREFETCH`).
    PrefetchFromEnvironment {
        /// The variable.
        variable: &'static str,
        /// Its value: readers per process.
        streams: usize,
    },
    /// Asked with no readers: nothing was warmed.
    PrefetchOff,
    /// The auto policy warmed files on a network filesystem before mapping
    /// them: `needed` of their `total` bytes were not in the page cache.
    PrefetchAuto {
        /// The filesystem of the first file.
        mount: Mount,
        /// Bytes not in the page cache.
        needed: u64,
        /// Bytes of the files.
        total: u64,
    },
    /// The auto policy left files on a network filesystem alone: every byte
    /// was already in the page cache.
    PrefetchAutoResident {
        /// The filesystem of the first file.
        mount: Mount,
    },
    /// The auto policy left files on a network filesystem alone: the memory
    /// guard would have left part of them cold (see the skip reasons).
    PrefetchAutoDoesNotFit {
        /// The filesystem of the first file.
        mount: Mount,
    },

    // A prefetch's queue.
    /// The caller asked for no shared queue: each local rank warmed a fixed
    /// share of the bytes.
    FixedShares,
    /// The shared queue file could not be had: each rank warmed a fixed
    /// share (a prefetch), or this rank read every chunk (a node copy).
    QueueNotShared {
        /// The queue file.
        path: PathBuf,
        /// Why, e.g. `a FIFO of uid 1000, not this user's`, or the OS's error.
        why: String,
        /// Whether it was a node copy's fill (this rank read every chunk).
        node_copy: bool,
    },
    /// A queue file left by an earlier run, or not a valid queue, was
    /// replaced by a new one.
    QueueReplaced {
        /// What was wrong with it.
        why: &'static str,
    },

    // A node copy's remarks.
    /// Another local user's process offered a copy: refused, never mapped.
    OfferRefused {
        /// Its pid.
        pid: u32,
        /// Its user.
        uid: u32,
    },
    /// A rank of this user holding a copy did not hand it over.
    HolderFailed {
        /// Its pid.
        pid: u32,
        /// What went wrong (no answer within the patience, not an offer, ...).
        why: String,
    },
    /// This rank could not hand its copy out to later ranks.
    NotHandedOut {
        /// The OS's error.
        why: String,
    },
    /// Chunks another rank had claimed, then stopped on, finished here.
    FinishedAfterStall {
        /// How many.
        chunks: usize,
    },
    /// Files of dead jobs removed from the queue directory.
    DeadJobsRemoved {
        /// How many.
        files: usize,
    },
    /// A name in the queue directory that is not this user's, or not what
    /// its name says: never opened, followed or removed.
    ForeignName {
        /// The name.
        name: String,
        /// What it is, e.g. `a FIFO`.
        kind: String,
        /// Whose it is, where the platform can tell.
        uid: Option<u32>,
        /// Whether it is this user's (and so not what its name says).
        this_user: bool,
    },
    /// More such names, not named one by one.
    MoreForeignNames {
        /// How many.
        count: usize,
    },

    // How the reads in flight were found.
    /// [`Loader::io_concurrency`](crate::Loader::io_concurrency) set them.
    ReadsSet {
        /// Reads in flight.
        readers: usize,
    },
    /// The load ended before a throughput could be measured: the start
    /// count stood.
    ReadsUnmeasured {
        /// Reads in flight.
        readers: usize,
    },
    /// Found by measurement: doubling them gained under 15 %.
    ReadsSettled {
        /// Reads in flight at the end.
        readers: usize,
        /// Each count tried, and the throughput it gave in GiB/s, in order.
        tried: Vec<(usize, f64)>,
    },
    /// Found by measurement: they reached the most allowed.
    ReadsAtMost {
        /// As in [`ReadsSettled`](Self::ReadsSettled).
        readers: usize,
        /// As in [`ReadsSettled`](Self::ReadsSettled).
        tried: Vec<(usize, f64)>,
    },
    /// Found by measurement: the load ended while throughput still rose.
    ReadsUntilEnd {
        /// As in [`ReadsSettled`](Self::ReadsSettled).
        readers: usize,
        /// As in [`ReadsSettled`](Self::ReadsSettled).
        tried: Vec<(usize, f64)>,
    },
}

impl Note {
    /// A stable name for the variant, for logs and JSON (`"threads_refused"`,
    /// `"ranges_ignored"`, `"prefetch_requested"`, `"reads_settled"`, ...:
    /// the variant's name in snake case).
    pub fn as_str(&self) -> &'static str {
        match self {
            Note::ThreadsRefused { .. } => "threads_refused",
            Note::RangesIgnored { .. } => "ranges_ignored",
            Note::ReadOncePerCluster { .. } => "read_once_per_cluster",
            Note::NodesReadAlone { .. } => "nodes_read_alone",
            Note::PrefetchRequested { .. } => "prefetch_requested",
            Note::PrefetchFromEnvironment { .. } => "prefetch_from_environment",
            Note::PrefetchOff => "prefetch_off",
            Note::PrefetchAuto { .. } => "prefetch_auto",
            Note::PrefetchAutoResident { .. } => "prefetch_auto_resident",
            Note::PrefetchAutoDoesNotFit { .. } => "prefetch_auto_does_not_fit",
            Note::FixedShares => "fixed_shares",
            Note::QueueNotShared { .. } => "queue_not_shared",
            Note::QueueReplaced { .. } => "queue_replaced",
            Note::OfferRefused { .. } => "offer_refused",
            Note::HolderFailed { .. } => "holder_failed",
            Note::NotHandedOut { .. } => "not_handed_out",
            Note::FinishedAfterStall { .. } => "finished_after_stall",
            Note::DeadJobsRemoved { .. } => "dead_jobs_removed",
            Note::ForeignName { .. } => "foreign_name",
            Note::MoreForeignNames { .. } => "more_foreign_names",
            Note::ReadsSet { .. } => "reads_set",
            Note::ReadsUnmeasured { .. } => "reads_unmeasured",
            Note::ReadsSettled { .. } => "reads_settled",
            Note::ReadsAtMost { .. } => "reads_at_most",
            Note::ReadsUntilEnd { .. } => "reads_until_end",
        }
    }

    /// Why workers fell short of what was asked, for `work`, if they did.
    pub(crate) fn threads(work: &'static str, started: &Started) -> Option<Note> {
        started.refused.as_ref().map(|e| Note::ThreadsRefused {
            work,
            started: started.started,
            requested: started.requested,
            error: e.to_string(),
        })
    }

    /// How the read engine's count settled.
    pub(crate) fn reads(settled: &Settled) -> Note {
        let readers = settled.readers;
        let tried = settled.steps.clone();
        match settled.why {
            SettleReason::Pinned => Note::ReadsSet { readers },
            _ if tried.is_empty() => Note::ReadsUnmeasured { readers },
            SettleReason::NoGain => Note::ReadsSettled { readers, tried },
            SettleReason::Max => Note::ReadsAtMost { readers, tried },
            SettleReason::Ended => Note::ReadsUntilEnd { readers, tried },
        }
    }
}

/// `on network (nfs4) at /mnt/models`: where an auto prefetch looked.
fn place(mount: &Mount) -> String {
    format!(
        "on {} ({}) at {}",
        mount.kind,
        mount.fs_type,
        mount.mount_point.display()
    )
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::ThreadsRefused { .. }
            | Note::RangesIgnored { .. }
            | Note::ReadOncePerCluster { .. }
            | Note::NodesReadAlone { .. } => self.fmt_load(f),
            Note::PrefetchRequested { .. }
            | Note::PrefetchFromEnvironment { .. }
            | Note::PrefetchOff
            | Note::PrefetchAuto { .. }
            | Note::PrefetchAutoResident { .. }
            | Note::PrefetchAutoDoesNotFit { .. } => self.fmt_prefetch(f),
            Note::FixedShares | Note::QueueNotShared { .. } | Note::QueueReplaced { .. } => {
                self.fmt_queue(f)
            }
            Note::OfferRefused { .. }
            | Note::HolderFailed { .. }
            | Note::NotHandedOut { .. }
            | Note::FinishedAfterStall { .. }
            | Note::DeadJobsRemoved { .. }
            | Note::ForeignName { .. }
            | Note::MoreForeignNames { .. } => self.fmt_node_copy(f),
            Note::ReadsSet { .. }
            | Note::ReadsUnmeasured { .. }
            | Note::ReadsSettled { .. }
            | Note::ReadsAtMost { .. }
            | Note::ReadsUntilEnd { .. } => self.fmt_reads(f),
        }
    }
}

// Each family's words. `fmt` sends each variant to its family; a variant of
// another family, which it never sends, says its code.
impl Note {
    /// The words of a load's notes: threads refused, ranges ignored, the
    /// cluster's reads.
    fn fmt_load(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::ThreadsRefused {
                work,
                started,
                requested,
                error,
            } => write!(
                f,
                "{work}: {started} of {requested} threads ran, the OS refused more ({error})"
            ),
            Note::RangesIgnored { files } => write!(
                f,
                "the server ignores Range: each file fetched whole ({files} file{})",
                if *files == 1 { "" } else { "s" }
            ),
            Note::ReadOncePerCluster {
                node,
                nodes,
                read,
                total,
            } => write!(
                f,
                "read once per cluster: this node (node {node} of {nodes}) read {} of {} from \
                 storage and received the rest from the other nodes, each range's SHA-256 checked",
                human_bytes(*read),
                human_bytes(*total),
            ),
            Note::NodesReadAlone { why } => write!(f, "each node read alone ({why})"),
            _ => f.write_str(self.as_str()),
        }
    }

    /// The words of a prefetch's reason: who asked for it, or what the auto
    /// policy saw.
    fn fmt_prefetch(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::PrefetchRequested { streams } => write!(f, "prefetch({streams}) was requested"),
            Note::PrefetchFromEnvironment { variable, streams } => {
                write!(f, "{variable}={streams} is set")
            }
            Note::PrefetchOff => f.write_str("streams(0): prefetch is off"),
            Note::PrefetchAuto {
                mount,
                needed,
                total,
            } => write!(
                f,
                "{}, {} of {} not in the page cache: warmed first, then mapped",
                place(mount),
                human_bytes(*needed),
                human_bytes(*total)
            ),
            Note::PrefetchAutoResident { mount } => {
                write!(f, "{}, already in the page cache", place(mount))
            }
            Note::PrefetchAutoDoesNotFit { mount } => write!(
                f,
                "{}, the checkpoint does not fit the memory guard",
                place(mount)
            ),
            _ => f.write_str(self.as_str()),
        }
    }

    /// The words of a prefetch's queue: fixed shares, or what became of the
    /// shared queue file.
    fn fmt_queue(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::FixedShares => f.write_str("shared_queue(false): a fixed share of the bytes"),
            Note::QueueNotShared {
                path,
                why,
                node_copy: false,
            } => write!(
                f,
                "no shared queue ({}: {why}): a fixed share of the bytes",
                path.display()
            ),
            Note::QueueNotShared { path, why, .. } => write!(
                f,
                "not shared: the chunk queue {} is {why}; every chunk read here",
                path.display()
            ),
            Note::QueueReplaced { why } => write!(f, "replaced a queue file: {why}"),
            _ => f.write_str(self.as_str()),
        }
    }

    /// The words of a node copy's remarks: its holders, its chunks, and the
    /// names in its queue directory left alone.
    fn fmt_node_copy(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::OfferRefused { pid, uid } => write!(
                f,
                "refused the copy offered by pid {pid}: it runs as uid {uid}, not this user's"
            ),
            Note::HolderFailed { pid, why } => write!(f, "pid {pid}: {why}"),
            Note::NotHandedOut { why } => write!(f, "not handed out from here: {why}"),
            Note::FinishedAfterStall { chunks } => {
                write!(f, "{chunks} chunk(s) finished here after a stall")
            }
            Note::DeadJobsRemoved { files } => write!(f, "{files} file(s) of dead jobs removed"),
            Note::ForeignName {
                name,
                kind,
                uid,
                this_user,
            } => match (uid, this_user) {
                (Some(_), true) => write!(f, "ignored {name} ({kind}, not what its name says)"),
                (Some(uid), false) => {
                    write!(f, "ignored {name} ({kind} of uid {uid}, not this user's)")
                }
                (None, _) => write!(f, "ignored {name} ({kind} of an unknown user)"),
            },
            Note::MoreForeignNames { count } => {
                write!(f, "ignored {count} more such name(s)")
            }
            _ => f.write_str(self.as_str()),
        }
    }

    /// The words of how the reads in flight were found: set, or measured.
    fn fmt_reads(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::ReadsSet { readers } => write!(f, "{readers} read(s) in flight, as set"),
            Note::ReadsUnmeasured { readers } => write!(
                f,
                "{readers} read(s) in flight (too short a load to measure)"
            ),
            Note::ReadsSettled { readers, tried } => {
                measured(f, *readers, tried, "doubling gained under 15 %")
            }
            Note::ReadsAtMost { readers, tried } => {
                measured(f, *readers, tried, "the most allowed")
            }
            Note::ReadsUntilEnd { readers, tried } => {
                measured(f, *readers, tried, "the load ended")
            }
            _ => f.write_str(self.as_str()),
        }
    }
}

/// `4 read(s) in flight, found by measurement (4: 1.02 GiB/s, ...; why)`.
fn measured(
    f: &mut fmt::Formatter<'_>,
    readers: usize,
    tried: &[(usize, f64)],
    why: &str,
) -> fmt::Result {
    write!(f, "{readers} read(s) in flight, found by measurement (")?;
    for (i, (n, rate)) in tried.iter().enumerate() {
        let sep = if i > 0 { ", " } else { "" };
        write!(f, "{sep}{n}: {rate:.2} GiB/s")?;
    }
    write!(f, "; {why})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reads_in_flight_said_as_before() {
        let settled = |why, steps: Vec<(usize, f64)>| Settled {
            readers: 8,
            steps,
            why,
        };
        let note = Note::reads(&settled(SettleReason::NoGain, vec![(4, 1.0)]));
        assert_eq!(note.as_str(), "reads_settled");
        assert_eq!(
            note.to_string(),
            "8 read(s) in flight, found by measurement (4: 1.00 GiB/s; doubling gained under 15 %)"
        );
        let note = Note::reads(&settled(SettleReason::Max, vec![(4, 2.0), (8, 3.0)]));
        assert!(matches!(&note, Note::ReadsAtMost { tried, .. } if tried.len() == 2));
        assert!(
            note.to_string()
                .ends_with("8: 3.00 GiB/s; the most allowed)")
        );
        let note = Note::reads(&settled(SettleReason::Ended, Vec::new()));
        assert_eq!(note, Note::ReadsUnmeasured { readers: 8 });
        assert!(note.to_string().contains("too short"), "{note}");
        assert_eq!(
            Note::reads(&settled(SettleReason::Pinned, Vec::new())).to_string(),
            "8 read(s) in flight, as set"
        );
    }

    /// `fmt` sends every variant to the family that has its words: none
    /// says only its code.
    #[test]
    #[rustfmt::skip] // One variant a line, as a table.
    fn every_variant_has_words_of_its_own() {
        let mount = || Mount {
            source: "hf-mount".into(),
            mount_point: "/mnt/hub".into(),
            fs_type: "fuse".into(),
            kind: crate::mount::MountKind::HfMount,
            detected_by: crate::mount::Detection::Device,
        };
        let why = || String::from("why");
        let tried = || vec![(1, 1.0)];
        let notes = [
            Note::ThreadsRefused { work: "reading", started: 1, requested: 2, error: why() },
            Note::RangesIgnored { files: 2 },
            Note::ReadOncePerCluster { node: 0, nodes: 2, read: 1, total: 2 },
            Note::NodesReadAlone { why: why() },
            Note::PrefetchRequested { streams: 1 },
            Note::PrefetchFromEnvironment { variable: "SAFELOAD_PREFETCH", streams: 1 },
            Note::PrefetchOff,
            Note::PrefetchAuto { mount: mount(), needed: 1, total: 2 },
            Note::PrefetchAutoResident { mount: mount() },
            Note::PrefetchAutoDoesNotFit { mount: mount() },
            Note::FixedShares,
            Note::QueueNotShared { path: "/tmp/q".into(), why: why(), node_copy: false },
            Note::QueueNotShared { path: "/tmp/q".into(), why: why(), node_copy: true },
            Note::QueueReplaced { why: "stale" },
            Note::OfferRefused { pid: 1, uid: 2 },
            Note::HolderFailed { pid: 1, why: why() },
            Note::NotHandedOut { why: why() },
            Note::FinishedAfterStall { chunks: 1 },
            Note::DeadJobsRemoved { files: 1 },
            Note::ForeignName { name: why(), kind: why(), uid: None, this_user: false },
            Note::MoreForeignNames { count: 1 },
            Note::ReadsSet { readers: 1 },
            Note::ReadsUnmeasured { readers: 1 },
            Note::ReadsSettled { readers: 1, tried: tried() },
            Note::ReadsAtMost { readers: 1, tried: tried() },
            Note::ReadsUntilEnd { readers: 1, tried: tried() },
        ];
        for note in &notes {
            assert_ne!(note.to_string(), note.as_str(), "{note:?}");
        }
    }

    #[test]
    fn every_code_is_its_variant_in_snake_case() {
        let notes = [
            Note::PrefetchOff,
            Note::FixedShares,
            Note::RangesIgnored { files: 1 },
            Note::DeadJobsRemoved { files: 2 },
            Note::MoreForeignNames { count: 3 },
        ];
        let codes: Vec<&str> = notes.iter().map(Note::as_str).collect();
        assert_eq!(
            codes,
            [
                "prefetch_off",
                "fixed_shares",
                "ranges_ignored",
                "dead_jobs_removed",
                "more_foreign_names"
            ]
        );
        assert_eq!(
            Note::RangesIgnored { files: 1 }.to_string(),
            "the server ignores Range: each file fetched whole (1 file)"
        );
    }
}
