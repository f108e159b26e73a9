//! What a report says beside its figures, as data, one type per field: what a load met ([`LoadNote`]), how its reads in flight were found ([`ConcurrencyReason`]), what a node copy met ([`CopyRemark`]); each with a stable code and its words (a prefetch's, `PrefetchReason` and `QueueNote`, in `prefetch.rs`).

use std::fmt;
use std::path::PathBuf;

use super::human_bytes;
use crate::adapt::{SettleReason, Settled};
use crate::workers::Started;

worded! {
/// What a load could not do as planned and did otherwise
/// ([`LoadReport::notes`](super::LoadReport::notes)).
///
/// ```
/// use safeload::report::LoadNote;
///
/// let note = LoadNote::RangesIgnored { files: 4 };
/// assert_eq!(note.as_str(), "ranges_ignored");
/// assert_eq!(note.to_string(), "the server ignores Range: each file fetched whole (4 files)");
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum LoadNote {
    /// The OS refused threads (`RLIMIT_NPROC`, a cgroup's `pids.max`).
    ThreadsRefused {
        /// What the threads were for (`"opening files"` or `"reading"`).
        work: &'static str,
        /// Threads that ran, the calling one included.
        started: usize,
        /// Threads asked for.
        requested: usize,
        /// The OS's answer to the first one refused.
        error: String,
    } = "threads_refused",
    /// A remote server answered a ranged request with the whole object: each file fetched
    /// whole, once.
    RangesIgnored {
        /// Files fetched whole.
        files: usize,
    } = "ranges_ignored",
    /// The nodes of a job read each byte once between them and exchanged the rest, each
    /// range's SHA-256 checked.
    ReadOncePerCluster {
        /// This node's index.
        node: usize,
        /// The job's nodes.
        nodes: usize,
        /// Bytes this node read from storage.
        read: u64,
        /// Bytes of the exchange.
        total: u64,
    } = "read_once_per_cluster",
    /// The nodes of a job could not split the reads, and each read alone.
    NodesReadAlone {
        /// Why, e.g. `node 2 sees another version of model.safetensors`.
        why: String,
    } = "nodes_read_alone",
}
}

impl LoadNote {
    /// Why workers fell short of what was asked, for `work`, if they did.
    pub(crate) fn threads(work: &'static str, started: &Started) -> Option<LoadNote> {
        started.refused.as_ref().map(|e| LoadNote::ThreadsRefused {
            work,
            started: started.started,
            requested: started.requested,
            error: e.to_string(),
        })
    }
}

impl fmt::Display for LoadNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadNote::ThreadsRefused {
                work,
                started,
                requested,
                error,
            } => write!(
                f,
                "{work}: {started} of {requested} threads ran, the OS refused more ({error})"
            ),
            LoadNote::RangesIgnored { files } => write!(
                f,
                "the server ignores Range: each file fetched whole ({files} file{})",
                if *files == 1 { "" } else { "s" }
            ),
            LoadNote::ReadOncePerCluster {
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
            LoadNote::NodesReadAlone { why } => write!(f, "each node read alone ({why})"),
        }
    }
}

worded! {
/// How a load's reads in flight were found
/// ([`LoadReport::io_concurrency_reason`](super::LoadReport::io_concurrency_reason)):
/// set, or measured with each count tried.
///
/// ```
/// use safeload::report::ConcurrencyReason;
///
/// fn tried(reason: &ConcurrencyReason) -> &[(usize, f64)] {
///     match reason {
///         ConcurrencyReason::Settled { tried, .. }
///         | ConcurrencyReason::AtMost { tried, .. }
///         | ConcurrencyReason::UntilEnd { tried, .. } => tried,
///         _ => &[],
///     }
/// }
/// assert!(tried(&ConcurrencyReason::Set { readers: 8 }).is_empty());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ConcurrencyReason {
    /// `Loader::io_concurrency` set them.
    Set {
        /// Reads in flight.
        readers: usize,
    } = "reads_set",
    /// The load ended before a throughput could be measured: the start count stood.
    Unmeasured {
        /// Reads in flight.
        readers: usize,
    } = "reads_unmeasured",
    /// Found by measurement: doubling them gained under 15 %.
    Settled {
        /// Reads in flight at the end.
        readers: usize,
        /// Each count tried, and the throughput it gave in GiB/s, in order.
        tried: Vec<(usize, f64)>,
    } = "reads_settled",
    /// Found by measurement: they reached the most allowed.
    AtMost {
        /// As in [`Settled`](Self::Settled).
        readers: usize,
        /// As in [`Settled`](Self::Settled).
        tried: Vec<(usize, f64)>,
    } = "reads_at_most",
    /// Found by measurement: the load ended while throughput still rose.
    UntilEnd {
        /// As in [`Settled`](Self::Settled).
        readers: usize,
        /// As in [`Settled`](Self::Settled).
        tried: Vec<(usize, f64)>,
    } = "reads_until_end",
}
}

impl ConcurrencyReason {
    /// How the read engine's count settled.
    pub(crate) fn of(settled: &Settled) -> ConcurrencyReason {
        let readers = settled.readers;
        let tried = settled.steps.clone();
        match settled.why {
            SettleReason::Pinned => ConcurrencyReason::Set { readers },
            _ if tried.is_empty() => ConcurrencyReason::Unmeasured { readers },
            SettleReason::NoGain => ConcurrencyReason::Settled { readers, tried },
            SettleReason::Max => ConcurrencyReason::AtMost { readers, tried },
            SettleReason::Ended => ConcurrencyReason::UntilEnd { readers, tried },
        }
    }
}

impl fmt::Display for ConcurrencyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (readers, tried, why) = match self {
            ConcurrencyReason::Set { readers } => {
                return write!(f, "{readers} read(s) in flight, as set");
            }
            ConcurrencyReason::Unmeasured { readers } => {
                return write!(
                    f,
                    "{readers} read(s) in flight (too short a load to measure)"
                );
            }
            ConcurrencyReason::Settled { readers, tried } => {
                (readers, tried, "doubling gained under 15 %")
            }
            ConcurrencyReason::AtMost { readers, tried } => (readers, tried, "the most allowed"),
            ConcurrencyReason::UntilEnd { readers, tried } => (readers, tried, "the load ended"),
        };
        write!(f, "{readers} read(s) in flight, found by measurement (")?;
        for (i, (n, rate)) in tried.iter().enumerate() {
            let sep = if i > 0 { ", " } else { "" };
            write!(f, "{sep}{n}: {rate:.2} GiB/s")?;
        }
        write!(f, "; {why})")
    }
}

worded! {
/// What a rank met on the way to a node copy ([`NodeCopy::Shared`](super::NodeCopy::Shared)'s
/// `remarks`): its holders, its chunk queue, the names in its queue directory left alone.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum CopyRemark {
    /// Another local user's process offered a copy: refused, never mapped.
    OfferRefused {
        /// Its pid.
        pid: u32,
        /// Its user.
        uid: u32,
    } = "offer_refused",
    /// A rank of this user holding a copy did not hand it over.
    HolderFailed {
        /// Its pid.
        pid: u32,
        /// What went wrong (no answer within the patience, not an offer, ...).
        why: String,
    } = "holder_failed",
    /// This rank could not hand its copy out to later ranks.
    NotHandedOut {
        /// The OS's error.
        why: String,
    } = "not_handed_out",
    /// The copy's chunk queue file could not be had: this rank read every chunk.
    QueueNotShared {
        /// The queue file.
        path: PathBuf => serialize_with = "crate::worded::path_text",
        /// Why, e.g. `a FIFO of uid 1000, not this user's`, or the OS's error.
        why: String,
    } = "queue_not_shared",
    /// Chunks another rank had claimed, then stopped on, finished here.
    FinishedAfterStall {
        /// How many.
        chunks: usize,
    } = "finished_after_stall",
    /// Files of dead jobs removed from the queue directory.
    DeadJobsRemoved {
        /// How many.
        files: usize,
    } = "dead_jobs_removed",
    /// A name in the queue directory not this user's, or not what it says: never opened.
    ForeignName {
        /// The name.
        name: String,
        /// What it is, e.g. `a FIFO`.
        kind: String,
        /// Whose it is, where the platform can tell.
        uid: Option<u32>,
        /// Whether it is this user's (and so not what its name says).
        this_user: bool,
    } = "foreign_name",
    /// More such names, not named one by one.
    MoreForeignNames {
        /// How many.
        count: usize,
    } = "more_foreign_names",
    /// Chunks another live rank held with no progress for the queue's patience, read here
    /// again.
    TakenOver {
        /// How many.
        chunks: usize,
        /// The ranks (pids) that held them.
        pids: Vec<u32>,
        /// How long each had shown no progress, at least, in milliseconds.
        quiet_ms: u64,
    } = "taken_over",
}
}

impl fmt::Display for CopyRemark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CopyRemark::OfferRefused { pid, uid } => write!(
                f,
                "refused the copy offered by pid {pid}: it runs as uid {uid}, not this user's"
            ),
            CopyRemark::HolderFailed { pid, why } => {
                write!(
                    f,
                    "pid {pid}, which holds a copy, did not hand it over: {why}"
                )
            }
            CopyRemark::NotHandedOut { why } => write!(f, "not handed out from here: {why}"),
            CopyRemark::QueueNotShared { path, why } => write!(
                f,
                "not shared: the chunk queue {} is {why}; every chunk read here",
                path.display()
            ),
            CopyRemark::FinishedAfterStall { chunks } => {
                write!(f, "{chunks} chunk(s) finished here after a stall")
            }
            CopyRemark::DeadJobsRemoved { files } => {
                write!(f, "{files} file(s) of dead jobs removed")
            }
            CopyRemark::ForeignName {
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
            CopyRemark::MoreForeignNames { count } => {
                write!(f, "ignored {count} more such name(s)")
            }
            CopyRemark::TakenOver {
                chunks,
                pids,
                quiet_ms,
            } => {
                let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
                let pids = pids.join(", ");
                write!(
                    f,
                    "{chunks} chunk(s) read here again: pid {pids} held them with no progress \
                     for {quiet_ms} ms"
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mount::Mount;
    use crate::report::{PrefetchReason, QueueNote};

    #[test]
    fn chunks_taken_over_say_whose_and_how_long_quiet() {
        let taken = CopyRemark::TakenOver {
            chunks: 2,
            pids: vec![4211, 4212],
            quiet_ms: 500,
        };
        assert_eq!(
            taken.to_string(),
            "2 chunk(s) read here again: pid 4211, 4212 held them with no progress for 500 ms"
        );
        assert_eq!(taken.as_str(), "taken_over");
    }

    #[test]
    fn the_reads_in_flight_said_as_before() {
        let settled = |why, steps: Vec<(usize, f64)>| Settled {
            readers: 8,
            steps,
            why,
        };
        let reason = ConcurrencyReason::of(&settled(SettleReason::NoGain, vec![(4, 1.0)]));
        assert_eq!(reason.as_str(), "reads_settled");
        assert_eq!(
            reason.to_string(),
            "8 read(s) in flight, found by measurement (4: 1.00 GiB/s; doubling gained under 15 %)"
        );
        let reason = ConcurrencyReason::of(&settled(SettleReason::Max, vec![(4, 2.0), (8, 3.0)]));
        assert!(matches!(&reason, ConcurrencyReason::AtMost { tried, .. } if tried.len() == 2));
        assert!(
            reason
                .to_string()
                .ends_with("8: 3.00 GiB/s; the most allowed)")
        );
        let reason = ConcurrencyReason::of(&settled(SettleReason::Ended, Vec::new()));
        assert_eq!(reason, ConcurrencyReason::Unmeasured { readers: 8 });
        assert!(reason.to_string().contains("too short"), "{reason}");
        assert_eq!(
            ConcurrencyReason::of(&settled(SettleReason::Pinned, Vec::new())).to_string(),
            "8 read(s) in flight, as set"
        );
    }

    /// Each variant of each type has words of its own, not its code, and a
    /// code of its own.
    #[test]
    #[rustfmt::skip] // One variant a line, as a table.
    fn every_variant_has_words_and_a_code_of_its_own() {
        let mount = || Mount {
            source: "hf-mount".into(),
            mount_point: "/mnt/hub".into(),
            fs_type: "fuse".into(),
            kind: crate::mount::MountKind::HfMount,
            detected_by: crate::mount::Detection::Device,
        };
        let why = || String::from("why");
        let tried = || vec![(1, 1.0)];
        let said = |words: String, code: &'static str| (words, code);
        let all = [
            [
                LoadNote::ThreadsRefused { work: "reading", started: 1, requested: 2, error: why() },
                LoadNote::RangesIgnored { files: 2 },
                LoadNote::ReadOncePerCluster { node: 0, nodes: 2, read: 1, total: 2 },
                LoadNote::NodesReadAlone { why: why() },
            ].map(|n| said(n.to_string(), n.as_str())).to_vec(),
            [
                ConcurrencyReason::Set { readers: 1 },
                ConcurrencyReason::Unmeasured { readers: 1 },
                ConcurrencyReason::Settled { readers: 1, tried: tried() },
                ConcurrencyReason::AtMost { readers: 1, tried: tried() },
                ConcurrencyReason::UntilEnd { readers: 1, tried: tried() },
            ].map(|n| said(n.to_string(), n.as_str())).to_vec(),
            [
                PrefetchReason::Requested { streams: 1 },
                PrefetchReason::FromEnvironment { variable: "SAFELOAD_PREFETCH", streams: 1 },
                PrefetchReason::Off,
                PrefetchReason::Auto { mount: mount(), needed: 1, total: 2 },
                PrefetchReason::AutoResident { mount: mount() },
                PrefetchReason::AutoDoesNotFit { mount: mount() },
            ].map(|n| said(n.to_string(), n.as_str())).to_vec(),
            [
                QueueNote::FixedShares,
                QueueNote::NotShared { path: "/tmp/q".into(), why: why() },
                QueueNote::Replaced { why: "stale" },
            ].map(|n| said(n.to_string(), n.as_str())).to_vec(),
            [
                CopyRemark::OfferRefused { pid: 1, uid: 2 },
                CopyRemark::HolderFailed { pid: 1, why: why() },
                CopyRemark::NotHandedOut { why: why() },
                CopyRemark::QueueNotShared { path: "/tmp/q".into(), why: why() },
                CopyRemark::FinishedAfterStall { chunks: 1 },
                CopyRemark::DeadJobsRemoved { files: 1 },
                CopyRemark::ForeignName { name: why(), kind: why(), uid: None, this_user: false },
                CopyRemark::MoreForeignNames { count: 1 },
            ].map(|n| said(n.to_string(), n.as_str())).to_vec(),
        ];
        for family in &all {
            let mut codes: Vec<&str> = family.iter().map(|(_, code)| *code).collect();
            codes.dedup();
            assert_eq!(codes.len(), family.len(), "{family:?}");
            for (words, code) in family {
                assert_ne!(words, code);
            }
        }
        assert_eq!(
            LoadNote::RangesIgnored { files: 1 }.to_string(),
            "the server ignores Range: each file fetched whole (1 file)"
        );
    }
}
