//! Another local user against a job's node copy. A process of another uid
//! (65534) that has learned a copy's key plants names in the queue
//! directory: a listener that never accepts, a listener whose backlog is
//! full, a regular file, a FIFO and a symlink at holder names (named by its
//! own live owner word, and by a dead one), the key's lock file, the fill's
//! queue file, and a listener bound the moment the lock file appears.
//! Meanwhile this user's three ranks load a small sharded checkpoint read
//! buffered, as root and as another ordinary user (65533). Each load ends
//! within the handoff's patience of a load with no attacker, with the naive
//! load's bytes, and its report names what it met; nothing of the
//! attacker's is removed, and the job leaves nothing of its own behind.
//!
//! The attacker's process is `attacker.rs`, which the benchmark
//! `cargo bench --bench node_copy -- --attacks` shares: it times each attack
//! against runs with no attacker (BENCHMARKS.md).
//!
//! Needs root (to play the users): skipped (loudly) without it, a failure
//! under `SAFELOAD_REQUIRE_ROOT=1`.

use std::os::unix::fs::PermissionsExt;

use super::attacker::{Attack, Attacker, Target, lock_key};
use super::*;

/// The victim's uid where it is not root.
const ORDINARY: u32 = 65533;
/// The handoff's patience (`PATIENCE` of `src/node/handoff.rs`).
const PATIENCE: Duration = Duration::from_secs(2);
/// How long a rank may take before it is taken as hung (today's hang
/// lasts as long as the attacker lives).
const HUNG: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// The job's side.

/// A checkpoint every user may read, and a queue directory every user may
/// write (as `/dev/shm`), for ranks of `uid` (root where `None`).
struct Scene {
    _source: TempDir,
    index: PathBuf,
    expected: u64,
    dir: TempDir,
    job: String,
    uid: Option<u32>,
}

impl Scene {
    fn new(uid: Option<u32>) -> Scene {
        let source = tempfile::tempdir().unwrap();
        std::fs::set_permissions(source.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (index, expected) = write_checkpoint(source.path(), 16, 3, "x");
        for file in std::fs::read_dir(source.path()).unwrap() {
            let perms = std::fs::Permissions::from_mode(0o644);
            std::fs::set_permissions(file.unwrap().path(), perms).unwrap();
        }
        Scene {
            _source: source,
            index,
            expected,
            dir: private_dir(),
            job: job_id(),
            uid,
        }
    }

    fn victim_uid(&self) -> u32 {
        self.uid.unwrap_or(0)
    }

    fn rank(&self, rank: usize) -> Rank {
        let mut env = vec![
            (BUFFERED, "1".to_string()),
            (DIR, self.dir.path().display().to_string()),
            (HOLD, "1".to_string()),
        ];
        if let Some(uid) = self.uid {
            env.push((SETUID, uid.to_string()));
        }
        Rank::spawn(&self.index, (rank, 3), &self.job, &env)
    }

    /// Three ranks load with no attacker: their reports, and the key of
    /// their copy (from the lock file's name while they hold it).
    fn quiet_run(&self) -> (Vec<Loaded>, u64) {
        let _ = safeload::evict(&self.index);
        let mut ranks: Vec<Rank> = (0..3).map(|r| self.rank(r)).collect();
        let loads: Vec<Loaded> = ranks.iter_mut().map(|r| r.loaded_within(HUNG)).collect();
        let key = lock_key(self.dir.path(), self.victim_uid()).expect("the lock file of the copy");
        for rank in ranks {
            rank.release();
        }
        for r in &loads {
            r.assert_copied(self.expected);
        }
        assert_no_leftovers(self.dir.path());
        (loads, key)
    }

    /// Three ranks load while the attacker plays `attack` on `key`: their
    /// reports (asserted: the bytes, the time within a `limit`), and the
    /// attacker's names (asserted: still there once the ranks are gone,
    /// and nothing of the job's left beside them).
    fn attacked_run(&self, attack: Attack, key: u64, limit: Duration) -> Vec<Loaded> {
        let _ = safeload::evict(&self.index);
        let target = Target {
            attack,
            dir: self.dir.path().to_path_buf(),
            key,
            victim: self.victim_uid(),
        };
        let cmd = child_command(MODULE, "attacker", &self.index);
        let mut attacker = Attacker::spawn(cmd, &target).unwrap();
        // The late listener waits for the lock file of the first rank.
        let mut ranks = Vec::new();
        if attack == Attack::Late {
            ranks.push(self.rank(0));
        }
        let names = attacker.planted().unwrap();
        while ranks.len() < 3 {
            ranks.push(self.rank(ranks.len()));
        }
        let loads: Vec<Loaded> = ranks.iter_mut().map(|r| r.loaded_within(limit)).collect();
        for rank in ranks {
            rank.release();
        }
        for name in &names {
            assert!(
                std::fs::symlink_metadata(name).is_ok(),
                "{attack:?}: the attacker's {} was removed",
                name.display()
            );
        }
        let ours: Vec<String> = leftovers(self.dir.path())
            .into_iter()
            .filter(|n| !names.iter().any(|p| p.ends_with(n)))
            .collect();
        assert!(ours.is_empty(), "{attack:?}: the job left {ours:?}");
        let status = attacker.release().unwrap();
        assert!(status.success(), "attacker: {status}");
        for r in &loads {
            assert_eq!(r.digest, self.expected, "{attack:?}: {r:?}");
        }
        loads
    }
}

/// The slowest rank's load time.
fn slowest(loads: &[Loaded]) -> f64 {
    loads.iter().map(|l| l.seconds).fold(0.0, f64::max)
}

/// Every attack against ranks of `uid`: each rank ends within the patience
/// of the quiet run's slowest (and 2 s for a busy machine: CI runs the
/// other tests of the binary beside), with the right bytes, saying what it
/// met.
fn every_attack(uid: Option<u32>) {
    if skip_without_root() {
        return;
    }
    let scene = Scene::new(uid);
    let (quiet, key) = scene.quiet_run();
    let bound = slowest(&quiet) + PATIENCE.as_secs_f64() + 2.0;
    for attack in Attack::ALL {
        let loads = scene.attacked_run(attack, key, HUNG);
        let reason = attack.reason();
        eprintln!(
            "{}: slowest rank {:.3} s (quiet {:.3} s); rank 2 says: {}",
            attack.name(),
            slowest(&loads),
            slowest(&quiet),
            loads[2].notes.first().map_or("", String::as_str)
        );
        for (rank, r) in loads.iter().enumerate() {
            assert!(r.seconds <= bound, "{attack:?}: {r:?} over {bound:.3} s");
            // The late listener comes after rank 0 has looked.
            if attack == Attack::Late && rank == 0 {
                continue;
            }
            assert_eq!(r.notes.len(), 3, "{attack:?}: {r:?}");
            for note in &r.notes {
                assert!(note.contains(&reason), "{attack:?}: {note}");
                assert!(
                    !note.contains("stall"),
                    "{attack:?}: nothing stalled: {note}"
                );
                if attack == Attack::Queue {
                    assert!(note.contains("not shared: the chunk queue"), "{note}");
                }
                if attack == Attack::Lock {
                    assert!(note.starts_with("not used: the lock file"), "{note}");
                    assert!(note.ends_with("each rank loads it alone"), "{note}");
                } else {
                    assert!(!note.starts_with("not used"), "{attack:?}: {note}");
                }
            }
        }
    }
}

/// Another user's names against ranks that run as root.
#[test]
fn another_users_names_cannot_stall_or_steer_root_ranks() {
    every_attack(None);
}

/// The same against ranks of an ordinary user.
#[test]
fn another_users_names_cannot_stall_or_steer_an_ordinary_users_ranks() {
    every_attack(Some(ORDINARY));
}
