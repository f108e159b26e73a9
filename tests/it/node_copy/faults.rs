//! The node copy when things go wrong or come late: a rank killed or
//! stopped mid-fill, a holder that does not hand its copy over, every rank
//! killed then a new job, a rank that starts
//! after the copy is complete, another user's copy, a memory cgroup too
//! small for the copy, and a 64 MiB `/dev/shm` (a private mount namespace).

use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use safeload_testfs::{Options, skip_without_fuse};

use super::*;
use crate::common::cgroup::{Cgroup, Controller};

/// What a rank that dies or stops may cost again: the chunks its 4 readers
/// held (of 256 KiB), and per file (3) the page-cache read-ahead of the
/// header read at open, which the fill's direct reads fetch again.
const AGAIN: u64 = 4 * (256 << 10) + 3 * (128 << 10);

/// A mount slow enough to act during the fill: 24 MiB at 16 MiB/s.
fn slow_fuse() -> OnFuse {
    on_fuse(
        24,
        Options {
            bandwidth_bytes_per_sec: Some(16 << 20),
            ..Options::default()
        },
    )
}

/// Small chunks (so that a rank holds little when it dies), in `dir`.
fn small_chunks(dir: &Path) -> Vec<(&'static str, String)> {
    vec![
        (CHUNK, (256 << 10).to_string()),
        (DIR, dir.display().to_string()),
    ]
}

/// Waits (at most 20 s) until the mount has served `bytes`.
fn wait_served(setup: &OnFuse, bytes: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while setup.fs.stats().bytes_read < bytes {
        assert!(Instant::now() < deadline, "the fill never got that far");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn signal(rank: &Rank, signal: Signal) {
    kill_process(Pid::from_raw(rank.pid() as i32).unwrap(), signal).unwrap();
}

/// A rank killed mid-fill: the others take its chunks over and finish, each
/// byte served at most once more than once for what it held.
#[test]
fn a_rank_killed_mid_fill_is_finished_by_the_others() {
    if skip_without_fuse() {
        return;
    }
    let setup = slow_fuse();
    let dir = private_dir();
    let job = job_id();
    let extra = small_chunks(dir.path());
    let mut ranks = spawn_job(&setup.index, 3, &job, &extra);
    wait_served(&setup, setup.total / 4);
    let mut victim = ranks.remove(1);
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    for mut rank in ranks {
        let r = rank.loaded();
        assert_eq!(r.digest, setup.expected, "{r:?}");
        rank.release();
    }
    let served = setup.fs.stats().bytes_read;
    assert!(
        served <= setup.total + AGAIN,
        "{served} for {}",
        setup.total
    );
    // The killed rank's socket is left, for the next job to remove.
    let left = leftovers(dir.path());
    assert!(left.iter().all(|n| n.ends_with(".sock")), "{left:?}");
}

/// A rank stopped mid-fill: the others take over its chunks within seconds
/// (the queue's rule), and the stopped one, resumed, finishes with the same
/// tensors.
#[test]
fn a_rank_stopped_mid_fill_is_taken_over_within_seconds() {
    if skip_without_fuse() {
        return;
    }
    let setup = slow_fuse();
    let dir = private_dir();
    let job = job_id();
    let extra = small_chunks(dir.path());
    let mut ranks = spawn_job(&setup.index, 3, &job, &extra);
    wait_served(&setup, setup.total / 4);
    signal(&ranks[1], Signal::STOP);
    let stopped = Instant::now();
    let mut said = Vec::new();
    for r in [0, 2] {
        let loaded = ranks[r].loaded();
        assert_eq!(loaded.digest, setup.expected, "{loaded:?}");
        said.extend(loaded.notes);
    }
    // The chunks the stopped rank held, read again, are said with whose
    // they were and why.
    let again = format!(
        "read here again: pid {} held them with no progress for",
        ranks[1].pid()
    );
    assert!(said.iter().any(|n| n.contains(&again)), "{said:#?}");
    let took = stopped.elapsed();
    eprintln!(
        "the other ranks finished {:.2} s after the stop",
        took.as_secs_f64()
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    signal(&ranks[1], Signal::CONT);
    let resumed = ranks[1].loaded();
    assert_eq!(resumed.digest, setup.expected, "{resumed:?}");
    for rank in ranks {
        rank.release();
    }
    let served = setup.fs.stats().bytes_read;
    assert!(
        served <= setup.total + AGAIN,
        "{served} for {}",
        setup.total
    );
    assert_no_leftovers(dir.path());
}

/// A holder that does not hand its copy over (stopped mid-fill, alone): the
/// rank that asks makes a copy of its own and fills it alone, never through
/// the holder's queue (whose chunks done are not in its copy), so its
/// tensors are the right bytes, and it says why; the holder, resumed,
/// finishes its own.
#[test]
fn a_holder_that_does_not_hand_over_leaves_a_copy_read_alone_and_right() {
    if skip_without_fuse() {
        return;
    }
    let setup = slow_fuse();
    let dir = private_dir();
    let job = job_id();
    let mut extra = small_chunks(dir.path());
    extra.push((HOLD, "1".to_string()));
    let mut holder = Rank::spawn(&setup.index, (0, 2), &job, &extra);
    wait_served(&setup, setup.total / 4);
    signal(&holder, Signal::STOP);
    let mut asker = Rank::spawn(&setup.index, (1, 2), &job, &extra);
    let r = asker.loaded();
    signal(&holder, Signal::CONT);
    assert_eq!(r.digest, setup.expected, "the right bytes: {r:?}");
    let failed = format!(
        "pid {}, which holds a copy, did not hand it over",
        holder.pid()
    );
    for note in &r.notes {
        assert!(
            note.contains("made here") && note.contains(&failed),
            "{note}"
        );
        assert!(
            note.contains("a copy of this rank's own, read alone"),
            "{note}"
        );
    }
    let (filled, chunks) = r.filled();
    assert_eq!(filled, chunks, "every chunk read here: {r:?}");
    let resumed = holder.loaded();
    assert_eq!(resumed.digest, setup.expected, "{resumed:?}");
    asker.release();
    holder.release();
    assert_no_leftovers(dir.path());
}

/// Every rank killed mid-fill leaves sockets, a lock and a queue file; the
/// next job (another id) removes them, loads, and leaves nothing.
#[test]
fn all_ranks_killed_then_a_new_job_leaves_nothing() {
    if skip_without_fuse() {
        return;
    }
    let setup = slow_fuse();
    let dir = private_dir();
    let extra = small_chunks(dir.path());
    let job = job_id();
    let ranks: Vec<Rank> = (0..3)
        .map(|r| Rank::spawn(&setup.index, (r, 3), &job, &extra))
        .collect();
    wait_served(&setup, setup.total / 4);
    for mut rank in ranks {
        rank.child.kill().unwrap();
        rank.child.wait().unwrap();
    }
    let left = leftovers(dir.path());
    assert!(left.iter().any(|n| n.ends_with(".sock")), "{left:?}");
    assert!(left.iter().any(|n| n.ends_with(".queue")), "{left:?}");

    let job = job_id();
    let mut ranks = spawn_job(&setup.index, 2, &job, &extra);
    for rank in &mut ranks {
        let r = rank.loaded();
        r.assert_copied(setup.expected);
    }
    for rank in ranks {
        rank.release();
    }
    assert_no_leftovers(dir.path());
}

/// A rank that starts after the copy is complete maps it at once: it reads
/// nothing.
#[test]
fn a_late_rank_maps_the_complete_copy_at_once() {
    if skip_without_fuse() {
        return;
    }
    let setup = on_fuse(16, Options::default());
    let job = job_id();
    let hold = [(HOLD, "1".to_string())];
    let mut early: Vec<Rank> = (0..2)
        .map(|r| Rank::spawn(&setup.index, (r, 3), &job, &hold))
        .collect();
    for rank in &mut early {
        assert_eq!(rank.loaded().digest, setup.expected);
    }
    let served = setup.fs.stats().bytes_read;
    let mut late = Rank::spawn(&setup.index, (2, 3), &job, &[]);
    let r = late.loaded();
    late.release();
    assert_eq!(r.digest, setup.expected, "{r:?}");
    assert_eq!(r.filled().0, 0, "{r:?}");
    assert!(
        r.notes.iter().all(|n| n.contains("received from pid")),
        "{r:?}"
    );
    let again = setup.fs.stats().bytes_read - served;
    assert!(again < 1 << 20, "the late rank read {again} bytes");
    for rank in early {
        rank.release();
    }
}

/// Another user's rank (a process that `setuid`s to `nobody`) hands out a
/// copy of the same files for the same job: this user's rank never asks its
/// socket (another user's, by `lstat`), says so, and makes its own.
#[test]
fn a_copy_offered_by_another_user_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    if skip_without_root() {
        return;
    }
    let source = tempfile::tempdir().unwrap();
    std::fs::set_permissions(source.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (index, expected) = write_checkpoint(source.path(), 8, 2, "u");
    for file in std::fs::read_dir(source.path()).unwrap() {
        let perms = std::fs::Permissions::from_mode(0o644);
        std::fs::set_permissions(file.unwrap().path(), perms).unwrap();
    }
    let dir = private_dir();
    let job = job_id();
    let common = [
        (BUFFERED, "1".to_string()),
        (DIR, dir.path().display().to_string()),
    ];
    let mut theirs = common.to_vec();
    theirs.extend([(SETUID, "65534".to_string()), (HOLD, "1".to_string())]);
    let mut other = Rank::spawn(&index, (0, 2), &job, &theirs);
    let r = other.loaded();
    assert_eq!(r.digest, expected, "{r:?}");
    assert!(r.notes.iter().all(|n| n.contains("made here")), "{r:?}");

    let mut mine = Rank::spawn(&index, (1, 2), &job, &common);
    let r = mine.loaded();
    mine.release();
    let other_pid = other.pid();
    other.release();
    assert_eq!(r.digest, expected, "{r:?}");
    // The other rank's socket, named by its owner word (pid in the low
    // 32 bits).
    let ignored = format!("{other_pid:08x}.sock (a socket of uid 65534, not this user's)");
    for note in &r.notes {
        assert!(
            note.contains("made here") && note.contains(&ignored),
            "{note}"
        );
    }
}

/// A memory cgroup too small for the copy: the ranks fall back (each reads
/// or maps the files itself) and say why.
#[test]
fn a_memory_limit_too_small_for_the_copy_falls_back_with_its_reason() {
    if skip_without_fuse() {
        return;
    }
    let Some(cgroup) = Cgroup::new(Controller::Memory) else {
        return;
    };
    let setup = on_fuse(24, Options::default());
    let job = job_id();
    let held = [(HELD, "1".to_string())];
    let mut ranks: Vec<Rank> = (0..2)
        .map(|r| {
            let mut rank = Rank::from_command(rank_command(&setup.index, (r, 2), &job, &held));
            let mut line = String::new();
            while !line.contains("READY") {
                line.clear();
                assert!(
                    rank.out.read_line(&mut line).unwrap() > 0,
                    "child ended early"
                );
            }
            cgroup.enter(rank.pid());
            rank
        })
        .collect();
    // 40 MiB of room: 24 MiB with the guard's margin (32 MiB and 2 MiB a
    // file) does not fit, nor one file of 8 MiB read by each rank.
    cgroup.limit(cgroup.usage() + (40 << 20));
    for rank in &mut ranks {
        writeln!(rank.child.stdin.as_mut().unwrap(), "go").unwrap();
    }
    for rank in &mut ranks {
        let r = rank.loaded();
        assert_eq!(r.digest, setup.expected, "{r:?}");
        assert_eq!(r.notes.len(), 3, "{r:?}");
        for note in &r.notes {
            assert!(note.starts_with("not used: the copy needs"), "{note}");
        }
    }
    for rank in ranks {
        rank.release();
    }
    assert!(!cgroup.oom_killed());
}

/// The private mount namespace's side of the 64 MiB `/dev/shm` test: a
/// tmpfs of 64 MiB over `/dev/shm`, then two ranks of a 96 MiB checkpoint,
/// whose copy is still shared (a memory file, not a file in `/dev/shm`).
pub fn act_as_namespace() {
    let path = std::path::PathBuf::from(std::env::var(PATH).unwrap());
    let expected =
        u64::from_str_radix(&std::env::var("SAFELOAD_TEST_NODE_EXPECTED").unwrap(), 16).unwrap();
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64m", "tmpfs", "/dev/shm"])
        .status()
        .unwrap();
    assert!(status.success(), "mount: {status}");
    let job = job_id();
    let hold = [(HOLD, "1".to_string())];
    let mut ranks = spawn_job(&path, 2, &job, &hold);
    let mut made = 0;
    for rank in &mut ranks {
        let r = rank.loaded();
        r.assert_copied(expected);
        made += r.notes.iter().filter(|n| n.contains("made here")).count();
    }
    assert_eq!(
        made, 3,
        "one rank made the copy of each file, the other received it"
    );
    let df = Command::new("df")
        .args(["-k", "/dev/shm"])
        .output()
        .unwrap();
    println!("{}", String::from_utf8_lossy(&df.stdout));
    for rank in ranks {
        rank.release();
    }
}

/// A container's `/dev/shm` of 64 MiB does not hold a copy of 96 MiB; a
/// memory file is no file of it.
#[test]
fn a_64_mib_dev_shm_still_shares_a_larger_copy() {
    if skip_without_fuse() {
        return;
    }
    let setup = on_fuse(96, Options::default());
    let mut cmd = Command::new("unshare");
    cmd.arg("-m").arg(std::env::current_exe().unwrap());
    let inner = child_command(MODULE, "namespace", &setup.index);
    cmd.args(inner.get_args());
    for (k, v) in inner.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let out = cmd
        .env(
            "SAFELOAD_TEST_NODE_EXPECTED",
            format!("{:016x}", setup.expected),
        )
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() && stdout.is_empty() {
        panic!("unshare -m failed: {}", out.status);
    }
    assert!(
        out.status.success() && stdout.contains("CHILD-DONE namespace"),
        "{}\n{stdout}",
        out.status
    );
    let served = setup.fs.stats().bytes_read;
    assert!(
        served as f64 <= 1.05 * setup.total as f64,
        "{served} for {}",
        setup.total
    );
}
