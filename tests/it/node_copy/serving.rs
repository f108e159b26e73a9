//! A holder's serving thread: asleep while the rank holds its tensors and
//! no peer asks (an inference server holds them for days), still answering
//! a rank that comes late, and gone promptly once the copy is dropped.
//!
//! Local files read buffered, in a private directory: no FUSE, no root.

use std::os::unix::fs::PermissionsExt;

use super::*;

/// A thread's CPU time and how often it was switched out, from
/// `/proc/<pid>/task/<tid>/`: `schedstat`'s nanoseconds on a CPU (where the
/// kernel keeps it), `stat`'s user and system ticks, `status`' voluntary
/// and involuntary context switches. A thread that wakes every 10 ms
/// switches 1,000 times in 10 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ThreadTime {
    cpu_ns: Option<u64>,
    ticks: u64,
    switches: u64,
}

impl ThreadTime {
    fn of(pid: u32, tid: &str) -> ThreadTime {
        let dir = format!("/proc/{pid}/task/{tid}");
        let stat = std::fs::read_to_string(format!("{dir}/stat")).unwrap();
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        // utime and stime: fields 14 and 15 of proc_pid_stat(5), the 12th
        // and 13th after the command name.
        let ticks = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        let status = std::fs::read_to_string(format!("{dir}/status")).unwrap();
        let switches = status
            .lines()
            .filter(|l| l.contains("ctxt_switches:"))
            .map(|l| l.split_whitespace().last().unwrap().parse::<u64>().unwrap())
            .sum();
        let cpu_ns = std::fs::read_to_string(format!("{dir}/schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok());
        ThreadTime {
            cpu_ns,
            ticks,
            switches,
        }
    }
}

/// The serving threads of process `pid` (named `safeload-node-copy`,
/// which the kernel keeps as its first 15 bytes).
fn serving_threads(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim() == "safeload-node-c")
        })
        .map(|t| t.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Two ranks hold their tensors for 10 s: their serving threads use no CPU
/// and are never switched in; then a third rank maps the copy from them at
/// once, and each rank, let go, exits within a second, leaving nothing.
#[test]
fn a_serving_thread_sleeps_while_idle_answers_and_stops_promptly() {
    let source = tempfile::tempdir().unwrap();
    std::fs::set_permissions(source.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (index, expected) = write_checkpoint(source.path(), 8, 2, "s");
    let dir = private_dir();
    let job = job_id();
    let env = [
        (BUFFERED, "1".to_string()),
        (DIR, dir.path().display().to_string()),
        (HOLD, "1".to_string()),
    ];
    let mut ranks: Vec<Rank> = (0..2)
        .map(|r| Rank::spawn(&index, (r, 3), &job, &env))
        .collect();
    for rank in &mut ranks {
        rank.loaded().assert_copied(expected);
    }
    let threads: Vec<(u32, String)> = ranks
        .iter()
        .flat_map(|r| serving_threads(r.pid()).into_iter().map(|t| (r.pid(), t)))
        .collect();
    assert_eq!(threads.len(), 2, "one serving thread per rank: {threads:?}");
    let before: Vec<ThreadTime> = threads.iter().map(|(p, t)| ThreadTime::of(*p, t)).collect();
    std::thread::sleep(Duration::from_secs(10));
    let after: Vec<ThreadTime> = threads.iter().map(|(p, t)| ThreadTime::of(*p, t)).collect();
    for (a, b) in before.iter().zip(&after) {
        let cpu = b.cpu_ns.zip(a.cpu_ns).map(|(b, a)| b - a);
        eprintln!(
            "serving thread over 10 idle s: {cpu:?} ns on a CPU, {} ticks, {} switches",
            b.ticks - a.ticks,
            b.switches - a.switches
        );
        assert_eq!(b.switches, a.switches, "woke while idle: {a:?} -> {b:?}");
        assert_eq!(b.ticks, a.ticks, "{a:?} -> {b:?}");
        if let Some(cpu) = cpu {
            assert_eq!(cpu, 0, "{a:?} -> {b:?}");
        }
    }
    let mut late = Rank::spawn(&index, (2, 3), &job, &env);
    let r = late.loaded();
    assert_eq!(r.digest, expected, "{r:?}");
    assert!(
        r.notes.iter().all(|n| n.contains("received from pid")),
        "{r:?}"
    );
    ranks.push(late);
    for rank in ranks {
        let pid = rank.pid();
        let started = Instant::now();
        rank.release();
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "rank {pid} took {took:?} to stop"
        );
    }
    assert_no_leftovers(dir.path());
}
