//! Which local rank this process is, from the launchers' variables (torchrun, Slurm, Open MPI, MPICH), and the job key that keeps one job's queue apart from another's.

use crate::policy::Environment;
use crate::report::RankSource;

/// This process's place among the job's processes on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalRank {
    /// Its index among them.
    pub rank: usize,
    /// How many there are.
    pub size: usize,
    /// Where it came from.
    pub source: RankSource,
}

/// The same source, its values found unusable (taken as one process).
fn invalid(mut source: RankSource) -> RankSource {
    if let RankSource::Caller { valid } | RankSource::Launcher { valid, .. } = &mut source {
        *valid = false;
    }
    source
}

impl LocalRank {
    /// The caller's local rank and size where set, else the launcher's.
    pub fn from_setting(setting: Option<(usize, usize)>, env: &Environment) -> LocalRank {
        match setting {
            Some((rank, size)) => {
                LocalRank::checked(Some(rank), Some(size), RankSource::Caller { valid: true })
            }
            None => detect_local_rank(env.lookup()),
        }
    }

    fn single(source: RankSource) -> LocalRank {
        LocalRank {
            rank: 0,
            size: 1,
            source,
        }
    }

    /// A rank below its size; else one process, its source found invalid.
    fn checked(rank: Option<usize>, size: Option<usize>, source: RankSource) -> LocalRank {
        match (rank, size) {
            (Some(rank), Some(size)) if rank < size => LocalRank { rank, size, source },
            _ => LocalRank::single(invalid(source)),
        }
    }
}

/// The launchers' rank variable, size variables (the first set) and name;
/// torchrun first, as under Slurm or MPI its variables describe its workers.
const LAUNCHERS: [(&str, &[&str], &str); 4] = [
    ("LOCAL_RANK", &["LOCAL_WORLD_SIZE"], "torchrun"),
    (
        "SLURM_LOCALID",
        &["SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"],
        "Slurm",
    ),
    (
        "OMPI_COMM_WORLD_LOCAL_RANK",
        &["OMPI_COMM_WORLD_LOCAL_SIZE"],
        "Open MPI",
    ),
    ("MPI_LOCALRANKID", &["MPI_LOCALNRANKS"], "MPICH/Intel MPI"),
];

/// The local rank and size from the first launcher whose variables are set
/// in `env`; values that are not numbers, or a rank not below the size, make
/// this process a single rank.
pub fn detect_local_rank(env: impl Fn(&str) -> Option<String>) -> LocalRank {
    for (rank_var, size_vars, launcher) in LAUNCHERS {
        let Some(rank_text) = env(rank_var) else {
            continue;
        };
        let Some((size_var, size_text)) = size_vars
            .iter()
            .find_map(|&name| env(name).map(|value| (name, value)))
        else {
            continue;
        };
        let source = RankSource::Launcher {
            launcher,
            rank_var,
            rank: rank_text.trim().to_string(),
            size_var,
            size: size_text.trim().to_string(),
            valid: true,
        };
        let rank = rank_text.trim().parse::<usize>().ok();
        return LocalRank::checked(rank, leading_number(&size_text), source);
    }
    LocalRank::single(RankSource::Alone)
}

/// The number a count starts with: Slurm writes `4(x2)` for "4 tasks on
/// each of 2 nodes", and `4,2(x3)` for uneven nodes.
fn leading_number(text: &str) -> Option<usize> {
    let text = text.trim();
    let end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    text.get(..end)?.parse().ok()
}

/// What identifies the job, so that its ranks share a queue and other jobs
/// do not: `SAFELOAD_JOB_ID`, else the launcher's job id, else the parent
/// process (the ranks of one launcher on a node are its children).
pub fn job_key(env: impl Fn(&str) -> Option<String>, parent_pid: u32) -> String {
    let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    if let Some(id) = set(crate::policy::JOB_ID_ENV) {
        return format!("safeload:{id}");
    }
    if let Some(id) = set("TORCHELASTIC_RUN_ID") {
        return format!("torchelastic:{id}");
    }
    if let Some(job) = set("SLURM_JOB_ID").or_else(|| set("SLURM_JOBID")) {
        let step = set("SLURM_STEP_ID")
            .or_else(|| set("SLURM_STEPID"))
            .unwrap_or_default();
        return format!("slurm:{job}.{step}");
    }
    if let Some(id) = set("OMPI_MCA_ess_base_jobid") {
        return format!("ompi:{id}");
    }
    format!("parent:{parent_pid}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// An environment of these variables only, for the functions that read
    /// it through a closure.
    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn rank_of(pairs: &[(&str, &str)]) -> (usize, usize) {
        let r = detect_local_rank(env_of(pairs));
        (r.rank, r.size)
    }

    #[test]
    fn rank_from_each_launcher() {
        assert_eq!(
            rank_of(&[("LOCAL_RANK", "3"), ("LOCAL_WORLD_SIZE", "8")]),
            (3, 8)
        );
        assert_eq!(
            rank_of(&[("SLURM_LOCALID", "1"), ("SLURM_NTASKS_PER_NODE", "4")]),
            (1, 4)
        );
        // Slurm's compressed form: 4 tasks on each of 2 nodes.
        assert_eq!(
            rank_of(&[("SLURM_LOCALID", "2"), ("SLURM_NTASKS_PER_NODE", "4(x2)")]),
            (2, 4)
        );
        // Without --ntasks-per-node, Slurm sets only SLURM_TASKS_PER_NODE.
        assert_eq!(
            rank_of(&[("SLURM_LOCALID", "1"), ("SLURM_TASKS_PER_NODE", "2(x3),1")]),
            (1, 2)
        );
        assert_eq!(
            rank_of(&[
                ("OMPI_COMM_WORLD_LOCAL_RANK", "5"),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "6")
            ]),
            (5, 6)
        );
        assert_eq!(
            rank_of(&[("MPI_LOCALRANKID", "0"), ("MPI_LOCALNRANKS", "2")]),
            (0, 2)
        );
        let r = detect_local_rank(env_of(&[("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")]));
        assert_eq!(
            r.source.to_string(),
            "LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 (torchrun)"
        );
    }

    #[test]
    fn torchrun_under_slurm_wins() {
        // torchrun started by srun: one Slurm task per node, 8 torchrun workers.
        let pairs = [
            ("SLURM_LOCALID", "0"),
            ("SLURM_NTASKS_PER_NODE", "1"),
            ("LOCAL_RANK", "6"),
            ("LOCAL_WORLD_SIZE", "8"),
        ];
        assert_eq!(rank_of(&pairs), (6, 8));
    }

    #[test]
    fn invalid_or_missing_is_one_process() {
        assert_eq!(rank_of(&[]), (0, 1));
        assert_eq!(rank_of(&[("LOCAL_RANK", "2")]), (0, 1), "no size");
        assert_eq!(
            rank_of(&[("LOCAL_RANK", "4"), ("LOCAL_WORLD_SIZE", "4")]),
            (0, 1)
        );
        assert_eq!(
            rank_of(&[("LOCAL_RANK", "x"), ("LOCAL_WORLD_SIZE", "4")]),
            (0, 1)
        );
        assert_eq!(
            rank_of(&[("LOCAL_RANK", "-1"), ("LOCAL_WORLD_SIZE", "4")]),
            (0, 1)
        );
        assert_eq!(
            rank_of(&[("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "0")]),
            (0, 1)
        );
        assert_eq!(
            rank_of(&[("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "")]),
            (0, 1)
        );
        let r = detect_local_rank(env_of(&[("LOCAL_RANK", "9"), ("LOCAL_WORLD_SIZE", "4")]));
        assert!(r.source.to_string().contains("invalid"), "{}", r.source);
    }

    #[test]
    fn the_job_id_set_by_hand_comes_before_every_launchers() {
        let both = [
            ("SAFELOAD_JOB_ID", "serve-a"),
            ("TORCHELASTIC_RUN_ID", "abc"),
        ];
        assert_eq!(job_key(env_of(&both), 7), "safeload:serve-a");
        let other = [
            ("SAFELOAD_JOB_ID", "serve-b"),
            ("TORCHELASTIC_RUN_ID", "abc"),
        ];
        assert_ne!(job_key(env_of(&both), 7), job_key(env_of(&other), 7));
        // Empty is unset.
        let empty = [("SAFELOAD_JOB_ID", " "), ("SLURM_JOB_ID", "42")];
        assert_eq!(job_key(env_of(&empty), 7), "slurm:42.");
    }

    #[test]
    fn job_key_from_each_launcher() {
        assert_eq!(
            job_key(env_of(&[("TORCHELASTIC_RUN_ID", "abc")]), 7),
            "torchelastic:abc"
        );
        assert_eq!(
            job_key(env_of(&[("SLURM_JOB_ID", "42"), ("SLURM_STEP_ID", "3")]), 7),
            "slurm:42.3"
        );
        assert_eq!(
            job_key(env_of(&[("SLURM_JOBID", "42"), ("SLURM_STEPID", "0")]), 7),
            "slurm:42.0"
        );
        assert_eq!(
            job_key(env_of(&[("OMPI_MCA_ess_base_jobid", "1234")]), 7),
            "ompi:1234"
        );
        assert_eq!(
            job_key(env_of(&[("TORCHELASTIC_RUN_ID", " ")]), 7),
            "parent:7"
        );
    }
}
