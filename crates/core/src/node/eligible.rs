//! Which files read buffered get a node copy, and why one does not (the report's `NodeCopy`).

use crate::report::NodeCopy;

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

/// The rule: whether a file read buffered by several ranks gets a copy.
pub(crate) fn eligible(facts: Facts) -> Result<(), NodeCopy> {
    if !facts.all_tensors {
        Err(NodeCopy::Filtered)
    } else if facts.converting {
        Err(NodeCopy::Converting)
    } else if !facts.aligned {
        Err(NodeCopy::Unaligned)
    } else if !facts.identity {
        Err(NodeCopy::NoIdentity)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                NodeCopy::Filtered,
            ),
            (
                Facts {
                    converting: true,
                    ..ok
                },
                NodeCopy::Converting,
            ),
            (
                Facts {
                    aligned: false,
                    ..ok
                },
                NodeCopy::Unaligned,
            ),
            (
                Facts {
                    identity: false,
                    ..ok
                },
                NodeCopy::NoIdentity,
            ),
            (
                Facts {
                    all_tensors: false,
                    converting: true,
                    ..ok
                },
                NodeCopy::Filtered,
            ),
        ];
        for (facts, why) in table {
            assert_eq!(eligible(facts), Err(why), "{facts:?}");
        }
    }
}
