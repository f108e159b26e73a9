//! Which files read buffered get a node copy, and why one does not (`NotUsed`), in words.

use std::fmt;

use super::handoff::MAX_FILES;
use crate::report::human_bytes;

/// What the eligibility rule looks at, for one file read buffered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Facts {
    /// Every tensor of the file is loaded (a filter may keep them all).
    pub all_tensors: bool,
    /// The load converts dtypes.
    pub converting: bool,
    /// Every tensor sits at an offset aligned for its dtype.
    pub aligned: bool,
    /// The file's version can be told (device, inode, size, mtime).
    pub identity: bool,
}

/// Why a file read buffered gets no node copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NotUsed {
    /// A filter: the copy is of whole files, the ranks' filters may differ.
    Filtered,
    /// A converting load reads its converted tensors itself.
    Converting,
    /// A tensor is misaligned in the file: a copy of the file could not
    /// hand out typed views of it.
    Unaligned,
    /// No device and inode to tell its version by.
    NoIdentity,
    /// More files than one handoff carries.
    TooManyFiles,
    /// The copy does not fit the memory guard (a `memfd` is charged to the
    /// cgroup like any memory).
    DoesNotFit { needed: u64, available: u64 },
    /// The rank that made the copy left this file out (its memory guard).
    LeftOut,
    /// Making, finding or filling the copy failed.
    Failed(String),
}

impl fmt::Display for NotUsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotUsed::Filtered => {
                f.write_str("a filter selects tensors; the copy is of whole files")
            }
            NotUsed::Converting => f.write_str("the load converts dtypes"),
            NotUsed::Unaligned => f.write_str("a tensor is not aligned for its dtype in the file"),
            NotUsed::NoIdentity => f.write_str("the file's version cannot be told"),
            NotUsed::TooManyFiles => write!(f, "more than {MAX_FILES} files"),
            NotUsed::DoesNotFit { needed, available } => write!(
                f,
                "the copy needs {} with its margin, {} available (MemAvailable and the cgroup's room): each rank loads it alone",
                human_bytes(*needed),
                human_bytes(*available)
            ),
            NotUsed::LeftOut => {
                f.write_str("the rank that made the copy left it out (its memory guard)")
            }
            NotUsed::Failed(why) => write!(f, "{why}: each rank loads it alone"),
        }
    }
}

/// The rule: whether a file read buffered by several ranks gets a copy.
pub(crate) fn eligible(facts: Facts) -> Result<(), NotUsed> {
    if !facts.all_tensors {
        Err(NotUsed::Filtered)
    } else if facts.converting {
        Err(NotUsed::Converting)
    } else if !facts.aligned {
        Err(NotUsed::Unaligned)
    } else if !facts.identity {
        Err(NotUsed::NoIdentity)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::PerFile;

    #[test]
    fn the_rule() {
        let ok = Facts {
            all_tensors: true,
            converting: false,
            aligned: true,
            identity: true,
        };
        assert_eq!(eligible(ok), Ok(()));
        let table = [
            (
                Facts {
                    all_tensors: false,
                    ..ok
                },
                NotUsed::Filtered,
            ),
            (
                Facts {
                    converting: true,
                    ..ok
                },
                NotUsed::Converting,
            ),
            (
                Facts {
                    aligned: false,
                    ..ok
                },
                NotUsed::Unaligned,
            ),
            (
                Facts {
                    identity: false,
                    ..ok
                },
                NotUsed::NoIdentity,
            ),
            (
                Facts {
                    all_tensors: false,
                    converting: true,
                    ..ok
                },
                NotUsed::Filtered,
            ),
        ];
        for (facts, why) in table {
            assert_eq!(eligible(facts), Err(why), "{facts:?}");
        }
    }

    #[test]
    fn reasons_in_words() {
        let why = NotUsed::DoesNotFit {
            needed: 3 << 30,
            available: 1 << 30,
        };
        let text = PerFile::NotUsed(why).note().unwrap();
        assert!(
            text.starts_with("not used: the copy needs 3.00 GiB"),
            "{text}"
        );
        assert!(text.contains("each rank loads it alone"), "{text}");
        assert_eq!(PerFile::Absent.note(), None);
    }
}
