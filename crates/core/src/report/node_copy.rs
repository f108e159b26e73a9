//! What the one copy per node did for a file, as data (`NodeCopy`): which rank made the copy, from which process this one took it, how many chunks it filled, or why there was no copy; with a stable code and its words.

use std::fmt;

use super::{CopyRemark, human_bytes};

worded! {
/// What the node copy did for one file ([`FileReport::node_copy`](super::FileReport::node_copy)):
/// its tensors are views of the node's one copy ([`Shared`](Self::Shared)), or why it got none
/// (the rank then read the file alone).
///
/// ```
/// use safeload::report::{FileReport, NodeCopy};
///
/// fn say(file: &FileReport) {
///     match &file.node_copy {
///         Some(NodeCopy::Shared { received_from: None, filled_here, chunks, .. }) => {
///             println!("this rank made the copy and filled {filled_here} of {chunks} chunks")
///         }
///         Some(NodeCopy::Shared { received_from: Some(pid), made_by_rank, .. }) => {
///             println!("taken from pid {pid}; local rank {made_by_rank} made it")
///         }
///         Some(why_not) => println!("read alone: {why_not} ({})", why_not.as_str()),
///         None => println!("one rank alone, or a mapped file: no copy considered"),
///     }
/// }
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum NodeCopy {
    /// The file's tensors are views of the node's copy: a sealed memory file every local rank
    /// maps read-only, filled once for the node.
    Shared {
        /// The process that made the copy (this one's own pid where it made it).
        made_by_pid: u32,
        /// That process's local rank.
        made_by_rank: usize,
        /// The process this rank took the copy from; `None` where it made it.
        received_from: Option<u32>,
        /// Chunks of the copy this rank filled.
        filled_here: usize,
        /// Chunks of the copy.
        chunks: usize,
        /// Whether the node's part of a load split between nodes filled it (`Loader::exchange`).
        by_exchange: bool,
        /// The copy's bytes: the file's.
        bytes: u64,
        /// The job's local ranks.
        ranks: usize,
        /// What this rank met on the way.
        remarks: Vec<CopyRemark>,
    } = "shared",
    /// A filter selects tensors: the copy is of whole files, and the ranks' filters may differ.
    Filtered = "filtered",
    /// The load converts dtypes: it reads its converted tensors itself.
    Converting = "converting",
    /// A tensor is not aligned for its dtype in the file: no typed view of a copy.
    Unaligned = "unaligned",
    /// The file's version cannot be told (no device and inode, no ETag).
    NoIdentity = "no_identity",
    /// More files than one handoff carries.
    TooManyFiles {
        /// The most files one copy holds.
        most: usize,
    } = "too_many_files",
    /// The copy does not fit the memory guard (a memory file is charged to the cgroup).
    DoesNotFit {
        /// Bytes the copy needs, its margin included.
        needed: u64,
        /// Memory available (`MemAvailable` and the cgroup's room).
        available: u64,
    } = "does_not_fit",
    /// The rank that made the copy left this file out (its memory guard).
    LeftOut = "left_out",
    /// Finding, making or filling the copy failed: each rank loads the file alone.
    Failed {
        /// What failed.
        why: String,
    } = "failed",
}
}

impl fmt::Display for NodeCopy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let NodeCopy::Shared {
            made_by_pid,
            made_by_rank,
            received_from,
            filled_here,
            chunks,
            by_exchange,
            bytes,
            ranks,
            remarks,
        } = self
        else {
            f.write_str("not used: ")?;
            return match self {
                NodeCopy::Filtered => {
                    f.write_str("a filter selects tensors; the copy is of whole files")
                }
                NodeCopy::Converting => f.write_str("the load converts dtypes"),
                NodeCopy::Unaligned => {
                    f.write_str("a tensor is not aligned for its dtype in the file")
                }
                NodeCopy::NoIdentity => f.write_str("the file's version cannot be told"),
                NodeCopy::TooManyFiles { most } => write!(f, "more than {most} files"),
                NodeCopy::DoesNotFit { needed, available } => write!(
                    f,
                    "the copy needs {} with its margin, {} available (MemAvailable and the \
                     cgroup's room): each rank loads it alone",
                    human_bytes(*needed),
                    human_bytes(*available)
                ),
                NodeCopy::LeftOut => {
                    f.write_str("the rank that made the copy left it out (its memory guard)")
                }
                NodeCopy::Failed { why } => write!(f, "{why}: each rank loads it alone"),
                NodeCopy::Shared { .. } => Ok(()),
            };
        };
        if *by_exchange {
            f.write_str("filled here by the node's part in the split between nodes")?;
        } else {
            write!(f, "filled here {filled_here} of {chunks} chunks")?;
        }
        write!(f, ", mapped from a memfd of {} ", human_bytes(*bytes))?;
        match received_from {
            None => f.write_str("made here")?,
            Some(pid) if pid == made_by_pid => write!(
                f,
                "received from pid {pid} (local rank {made_by_rank}, which made it)"
            )?,
            Some(pid) => write!(
                f,
                "received from pid {pid} (made by local rank {made_by_rank}, pid {made_by_pid})"
            )?,
        }
        write!(f, " (shared by the job's {ranks} local ranks)")?;
        for remark in remarks {
            write!(f, "; {remark}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(received_from: Option<u32>) -> NodeCopy {
        NodeCopy::Shared {
            made_by_pid: 10,
            made_by_rank: 2,
            received_from,
            filled_here: 3,
            chunks: 6,
            by_exchange: false,
            bytes: 48 << 20,
            ranks: 3,
            remarks: vec![CopyRemark::DeadJobsRemoved { files: 1 }],
        }
    }

    #[test]
    fn a_copy_in_words() {
        assert_eq!(
            shared(None).to_string(),
            "filled here 3 of 6 chunks, mapped from a memfd of 48.00 MiB made here (shared by \
             the job's 3 local ranks); 1 file(s) of dead jobs removed"
        );
        assert!(
            shared(Some(10))
                .to_string()
                .contains("received from pid 10 (local rank 2, which made it)")
        );
        assert!(
            shared(Some(11))
                .to_string()
                .contains("received from pid 11 (made by local rank 2, pid 10)")
        );
        assert_eq!(shared(None).as_str(), "shared");
    }

    #[test]
    fn why_not_in_words() {
        let why = NodeCopy::DoesNotFit {
            needed: 3 << 30,
            available: 1 << 30,
        };
        let text = why.to_string();
        assert!(
            text.starts_with("not used: the copy needs 3.00 GiB"),
            "{text}"
        );
        assert!(text.contains("each rank loads it alone"), "{text}");
        assert_eq!(why.as_str(), "does_not_fit");
        assert_eq!(
            NodeCopy::TooManyFiles { most: 250 }.to_string(),
            "not used: more than 250 files"
        );
    }
}
