//! Which node a process is on: the number a user or the launcher gives, else the processes that
//! can share memory (decided by MPI at the split, `setup.rs`).

use std::fmt;

use safeload_core::cluster::ExchangeError;

/// The node's number given by the user, before any launcher's (processes of one machine can
/// stand in for nodes).
pub(crate) const NODE_ID_ENV: &str = "SAFELOAD_NODE_ID";

/// Slurm's relative node number within the job's allocation (`srun` sets it in every task).
pub(crate) const SLURM_NODE_ID_ENV: &str = "SLURM_NODEID";

/// How the processes of a job tell which node each is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeIdentity {
    /// A number from a variable: one node per number, indexed in their order.
    Given { id: i32, source: IdSource },
    /// Neither variable: the processes that can share memory (`MPI_COMM_TYPE_SHARED`) are one
    /// node, indexed in the order of their first world rank.
    SharedMemory,
}

/// Where a [`NodeIdentity::Given`] number came from ([`NODE_ID_ENV`] or
/// [`SLURM_NODE_ID_ENV`]), as the tag of its [`encode`](NodeIdentity::encode)d form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdSource {
    Override = 1,
    Slurm = 2,
}

impl NodeIdentity {
    /// The identity of this process from `var`, a lookup of the environment: [`NODE_ID_ENV`],
    /// else [`SLURM_NODE_ID_ENV`], else the shared-memory split. A value that is not a number
    /// from 0 to `i32::MAX` (MPI's colors are C `int`s) is an error naming the variable.
    pub(crate) fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, ExchangeError> {
        for (name, source) in [
            (NODE_ID_ENV, IdSource::Override),
            (SLURM_NODE_ID_ENV, IdSource::Slurm),
        ] {
            let Some(text) = var(name) else { continue };
            let id = text
                .trim()
                .parse::<i32>()
                .ok()
                .filter(|id| *id >= 0)
                .ok_or_else(|| {
                    let max = i32::MAX;
                    super::setup_error(format!("{name}={text:?} is not a node number (0 to {max})"))
                })?;
            return Ok(NodeIdentity::Given { id, source });
        }
        Ok(NodeIdentity::SharedMemory)
    }

    /// The identity as two numbers for the processes to compare (`setup.rs`): how they are
    /// identified (0 by shared memory), and the number.
    pub(crate) fn encode(self) -> [i32; 2] {
        match self {
            NodeIdentity::SharedMemory => [0, 0],
            NodeIdentity::Given { id, source } => [source as i32, id],
        }
    }

    /// How a process whose encoded identity starts with `tag` is identified, in words.
    pub(crate) fn describe_tag(tag: i32) -> &'static str {
        match tag {
            0 => "MPI's shared-memory split",
            1 => NODE_ID_ENV,
            2 => SLURM_NODE_ID_ENV,
            _ => "an unknown source",
        }
    }
}

impl fmt::Display for NodeIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeIdentity::SharedMemory => f.write_str(Self::describe_tag(0)),
            NodeIdentity::Given { id, source } => {
                write!(f, "{}={id}", Self::describe_tag(*source as i32))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use safeload_core::cluster::ExchangeErrorKind;

    fn identity(pairs: &[(&str, &str)]) -> Result<NodeIdentity, ExchangeError> {
        NodeIdentity::from_vars(|name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn the_override_comes_first_then_slurm_then_shared_memory() {
        use IdSource::*;
        use NodeIdentity::*;
        let table: [(&[(&str, &str)], NodeIdentity); 5] = [
            (&[], SharedMemory),
            (
                &[(SLURM_NODE_ID_ENV, "3")],
                Given {
                    id: 3,
                    source: Slurm,
                },
            ),
            (
                &[(NODE_ID_ENV, "0")],
                Given {
                    id: 0,
                    source: Override,
                },
            ),
            (
                &[(NODE_ID_ENV, " 7\n"), (SLURM_NODE_ID_ENV, "3")],
                Given {
                    id: 7,
                    source: Override,
                },
            ),
            (
                &[(NODE_ID_ENV, "2147483647")],
                Given {
                    id: i32::MAX,
                    source: Override,
                },
            ),
        ];
        for (vars, expected) in table {
            assert_eq!(identity(vars).unwrap(), expected, "{vars:?}");
        }
    }

    #[test]
    fn a_variable_that_is_not_a_node_number_is_an_error_naming_it() {
        for (name, value) in [
            (NODE_ID_ENV, ""),
            (NODE_ID_ENV, "node-a"),
            (NODE_ID_ENV, "-1"),
            (NODE_ID_ENV, "2147483648"),
            (SLURM_NODE_ID_ENV, "x"),
        ] {
            let err = identity(&[(name, value)]).unwrap_err();
            assert_eq!(err.kind(), ExchangeErrorKind::Setup);
            assert_eq!(
                err.to_string(),
                format!("{name}={value:?} is not a node number (0 to 2147483647)")
            );
        }
    }

    #[test]
    fn identities_are_told_apart_by_their_encoding_and_described_in_words() {
        let override_ = NodeIdentity::Given {
            id: 4,
            source: IdSource::Override,
        };
        let slurm = NodeIdentity::Given {
            id: 4,
            source: IdSource::Slurm,
        };
        assert_eq!(override_.encode(), [1, 4]);
        assert_eq!(slurm.encode(), [2, 4]);
        assert_eq!(NodeIdentity::SharedMemory.encode(), [0, 0]);
        assert_eq!(override_.to_string(), "SAFELOAD_NODE_ID=4");
        assert_eq!(slurm.to_string(), "SLURM_NODEID=4");
        assert_eq!(
            NodeIdentity::SharedMemory.to_string(),
            "MPI's shared-memory split"
        );
    }
}
