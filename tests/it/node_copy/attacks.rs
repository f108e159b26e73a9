//! Another local user against a job's node copy. A process of another uid
//! (65534) that has learned a copy's key plants names in the queue
//! directory: a listener that never accepts, a listener whose backlog is
//! full, a regular file, a FIFO and a symlink at holder names (named by its
//! own live owner word, and by a dead one), the key's lock file, the fill's
//! queue file, and a listener bound the moment the lock file appears. Meanwhile this user's
//! three ranks load a small sharded checkpoint read buffered, as root and
//! as another ordinary user (65533). Each load ends within the handoff's
//! patience of a load with no attacker, with the naive load's bytes, and
//! its report names what it met; nothing of the attacker's is removed, and
//! the job leaves nothing of its own behind.
//!
//! `attack_figures` (ignored; BENCHMARKS.md) prints each attack's load time
//! against runs with no attacker.
//!
//! Needs root (to play the users): skipped (loudly) without it, a failure
//! under `SAFELOAD_REQUIRE_ROOT=1`.

use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;

use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

use super::*;

/// Which attack a child plays.
const ATTACK: &str = "SAFELOAD_TEST_NODE_ATTACK";
/// The key of the copy attacked, in hex (learned from an earlier run).
const KEY: &str = "SAFELOAD_TEST_NODE_KEY";
/// The uid whose lock file the attacker takes or waits for.
const VICTIM_UID: &str = "SAFELOAD_TEST_NODE_VICTIM_UID";
/// The attacker's uid (`nobody`).
const ATTACKER: u32 = 65534;
/// The victim's uid where it is not root.
const ORDINARY: u32 = 65533;
/// The handoff's patience (`PATIENCE` of `src/node/handoff.rs`).
const PATIENCE: Duration = Duration::from_secs(2);
/// How long a rank may take before it is taken as hung (today's hang
/// lasts as long as the attacker lives).
const HUNG: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attack {
    /// A socket that listens (backlog 16) and never accepts.
    Silent,
    /// A socket whose backlog (0) is full: a connect blocks.
    Backlog,
    /// Regular files at holder names.
    File,
    /// FIFOs at holder names.
    Fifo,
    /// Symlinks at holder names, one to a full listener elsewhere.
    Symlink,
    /// The key's lock file, made first by the attacker.
    Lock,
    /// The fill's queue file, made first by the attacker.
    Queue,
    /// A full listener bound as soon as the lock file appears.
    Late,
}

impl Attack {
    const ALL: [Attack; 8] = [
        Attack::Silent,
        Attack::Backlog,
        Attack::File,
        Attack::Fifo,
        Attack::Symlink,
        Attack::Lock,
        Attack::Queue,
        Attack::Late,
    ];

    fn name(self) -> &'static str {
        match self {
            Attack::Silent => "silent listener",
            Attack::Backlog => "full backlog",
            Attack::File => "regular file",
            Attack::Fifo => "FIFO",
            Attack::Symlink => "symlink",
            Attack::Lock => "lock taken",
            Attack::Queue => "queue taken",
            Attack::Late => "listener after the lock",
        }
    }

    fn parse(name: &str) -> Attack {
        *Attack::ALL.iter().find(|a| a.name() == name).unwrap()
    }

    /// What a rank that met the attack says in each file's note.
    fn reason(self) -> String {
        let kind = match self {
            Attack::Silent | Attack::Backlog | Attack::Late => "a socket",
            Attack::File | Attack::Lock | Attack::Queue => "a file",
            Attack::Fifo => "a FIFO",
            Attack::Symlink => "a symlink",
        };
        format!("{kind} of uid {ATTACKER}, not this user's")
    }
}

// ---------------------------------------------------------------------------
// The attacker's side.

/// Plays `ATTACK` as uid 65534 in `DIR`, prints `ATTACK-READY`, the names
/// it made and `ATTACK-END`, then keeps them until a line arrives on stdin.
pub fn act_as_attacker() {
    let attack = Attack::parse(&std::env::var(ATTACK).unwrap());
    let dir = PathBuf::from(std::env::var(DIR).unwrap());
    let victim: u32 = std::env::var(VICTIM_UID).unwrap().parse().unwrap();
    become_user(ATTACKER);
    let (me, dead) = (own_word(), dead_word());
    let key = if attack == Attack::Late {
        wait_for_lock(&dir, victim)
    } else {
        u64::from_str_radix(&std::env::var(KEY).unwrap(), 16).unwrap()
    };
    let holder = |word: u64| dir.join(format!("safeload-node-{key:016x}-{word:016x}.sock"));
    let mut names = Vec::new();
    let mut keep: Vec<OwnedFd> = Vec::new();
    match attack {
        Attack::Silent => {
            keep.push(listen(&holder(me), 16));
            names.push(holder(me));
        }
        Attack::Backlog | Attack::Late => {
            keep.extend(full_listener(&holder(me)));
            names.push(holder(me));
        }
        Attack::File => {
            for word in [me, dead] {
                std::fs::write(holder(word), b"not a socket").unwrap();
                names.push(holder(word));
            }
        }
        Attack::Fifo => {
            for word in [me, dead] {
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    holder(word),
                    rustix::fs::FileType::Fifo,
                    rustix::fs::Mode::from_raw_mode(0o666),
                    0,
                )
                .unwrap();
                names.push(holder(word));
            }
        }
        Attack::Symlink => {
            let hidden = dir.join(format!("attacker-{}.sock", std::process::id()));
            keep.extend(full_listener(&hidden));
            std::os::unix::fs::symlink(&hidden, holder(me)).unwrap();
            std::os::unix::fs::symlink("/etc/hostname", holder(dead)).unwrap();
            names.extend([hidden, holder(me), holder(dead)]);
        }
        Attack::Lock | Attack::Queue => {
            let name = if attack == Attack::Lock {
                format!("safeload-node-{key:016x}-u{victim}.lock")
            } else {
                queue_name(key, victim)
            };
            std::fs::write(dir.join(&name), b"").unwrap();
            let perms = std::fs::Permissions::from_mode(0o666);
            std::fs::set_permissions(dir.join(&name), perms).unwrap();
            names.push(dir.join(name));
        }
    }
    println!("ATTACK-READY");
    for name in &names {
        println!("ATTACK-NAME {}", name.display());
    }
    println!("ATTACK-END");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    for name in &names {
        let _ = std::fs::remove_file(name);
    }
    drop(keep);
}

/// The name of the queue file that fills the copy of `key` for `uid`,
/// worked out as the node copy does (`node/fill.rs`: the key, the uid and
/// a label, then the queue format's version, `prefetch/queue_file.rs`),
/// all of which an attacker who read the lock file's name knows.
fn queue_name(key: u64, uid: u32) -> String {
    let material = [
        &key.to_le_bytes()[..],
        &uid.to_le_bytes(),
        b"node copy queue",
        &2u64.to_le_bytes(),
    ]
    .concat();
    let hash = material.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("safeload-prefetch-{hash:016x}.queue")
}

/// `setgid` and `setuid` to `uid`.
fn become_user(uid: u32) {
    // SAFETY: plain system calls on ids; glibc applies them to every thread
    // of the process.
    let (g, u) = unsafe { (libc::setgid(uid), libc::setuid(uid)) };
    assert_eq!((g, u), (0, 0), "setgid/setuid({uid})");
}

/// This process's owner word, as the node copy names a holder's socket:
/// the low 30 bits of its start time (field 22 of `/proc/self/stat`) over
/// its pid.
fn own_word() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let start: u64 = after.split(' ').nth(19).unwrap().parse().unwrap();
    ((start & 0x3FFF_FFFF) << 32) | u64::from(std::process::id())
}

/// The owner word of a process that has exited.
fn dead_word() -> u64 {
    let mut child = Command::new("true").spawn().unwrap();
    child.wait().unwrap();
    (1 << 32) | u64::from(child.id())
}

/// A socket listening at `path` with `backlog`, open to every user.
fn listen(path: &Path, backlog: i32) -> OwnedFd {
    let fd = rustix::net::socket(AddressFamily::UNIX, SocketType::STREAM, None).unwrap();
    rustix::net::bind(&fd, &SocketAddrUnix::new(path).unwrap()).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
    rustix::net::listen(&fd, backlog).unwrap();
    fd
}

/// A listener at `path` whose backlog is full: one connection queued
/// (backlog 0 holds one), so that the next connect blocks (checked).
fn full_listener(path: &Path) -> [OwnedFd; 2] {
    let listener = listen(path, 0);
    let addr = SocketAddrUnix::new(path).unwrap();
    let queued = rustix::net::socket(AddressFamily::UNIX, SocketType::STREAM, None).unwrap();
    rustix::net::connect(&queued, &addr).unwrap();
    let probe = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::NONBLOCK,
        None,
    )
    .unwrap();
    assert_eq!(
        rustix::net::connect(&probe, &addr),
        Err(rustix::io::Errno::AGAIN),
        "the backlog is full"
    );
    [listener, queued]
}

/// The key of the first lock file of `uid` to appear in `dir` (polled
/// every millisecond, for at most a minute).
fn wait_for_lock(dir: &Path, uid: u32) -> u64 {
    let suffix = format!("-u{uid}.lock");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(key) = name
                .strip_prefix("safeload-node-")
                .and_then(|n| n.strip_suffix(&suffix))
            {
                return u64::from_str_radix(key, 16).unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("no lock file of uid {uid} appeared");
}

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
        let suffix = format!("-u{}.lock", self.victim_uid());
        let key = leftovers(self.dir.path())
            .iter()
            .find_map(|n| {
                n.strip_prefix("safeload-node-")?
                    .strip_suffix(&suffix)
                    .map(str::to_owned)
            })
            .map(|k| u64::from_str_radix(&k, 16).unwrap())
            .expect("the lock file of the copy");
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
        let mut cmd = child_command(MODULE, "attacker", &self.index);
        cmd.env(ATTACK, attack.name())
            .env(KEY, format!("{key:016x}"))
            .env(VICTIM_UID, self.victim_uid().to_string())
            .env(DIR, self.dir.path())
            .stdin(Stdio::piped());
        let mut attacker = cmd.spawn().unwrap();
        let mut out = BufReader::new(attacker.stdout.take().unwrap());
        // The late listener waits for the lock file of the first rank.
        let mut ranks = Vec::new();
        if attack == Attack::Late {
            ranks.push(self.rank(0));
        }
        let names = attacker_names(&mut out);
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
        writeln!(attacker.stdin.as_mut().unwrap(), "go").unwrap();
        let status = attacker.wait().unwrap();
        assert!(status.success(), "attacker: {status}");
        for r in &loads {
            assert_eq!(r.digest, self.expected, "{attack:?}: {r:?}");
        }
        loads
    }
}

/// The names an attacker reports once it is ready.
fn attacker_names(out: &mut BufReader<ChildStdout>) -> Vec<PathBuf> {
    let mut names = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the attacker ended");
        let line = line.trim_end();
        if let Some((_, name)) = line.split_once("ATTACK-NAME ") {
            names.push(PathBuf::from(name));
        } else if line.ends_with("ATTACK-END") {
            return names;
        }
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

/// The figures of BENCHMARKS.md's table of attacks: per victim (root, then
/// uid 65533) and per attack, the slowest rank's load time over `ROUNDS`
/// rounds, arms shuffled in each round (a quiet run is one arm), each rank
/// its own process, the files evicted before each run. Run with
/// `cargo test --test it node_copy::attacks::attack_figures -- --ignored --nocapture`.
#[test]
#[ignore = "prints figures (BENCHMARKS.md)"]
fn attack_figures() {
    if skip_without_root() {
        return;
    }
    const ROUNDS: usize = 5;
    for uid in [None, Some(ORDINARY)] {
        let scene = Scene::new(uid);
        let (_, key) = scene.quiet_run();
        let arms: Vec<Option<Attack>> =
            std::iter::once(None).chain(Attack::ALL.map(Some)).collect();
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); arms.len()];
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ u64::from(std::process::id());
        for _ in 0..ROUNDS {
            let mut order: Vec<usize> = (0..arms.len()).collect();
            for i in (1..order.len()).rev() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                order.swap(i, (seed % (i as u64 + 1)) as usize);
            }
            for arm in order {
                let loads = match arms[arm] {
                    None => scene.quiet_run().0,
                    Some(attack) => scene.attacked_run(attack, key, HUNG),
                };
                times[arm].push(slowest(&loads));
            }
        }
        let victim = uid.map_or("root".to_string(), |u| format!("uid {u}"));
        let quiet = median(&times[0]);
        println!("victim {victim}, 3 ranks, 16 MiB in 3 files, {ROUNDS} rounds:");
        for (arm, t) in arms.iter().zip(&times) {
            let name = arm.map_or("no attacker", Attack::name);
            let (lo, hi) = t
                .iter()
                .fold((f64::MAX, 0.0_f64), |(a, b), &x| (a.min(x), b.max(x)));
            println!(
                "  {name:<24} median {:.3} s (min {lo:.3}, max {hi:.3}), {:.2}x the quiet median",
                median(t),
                median(t) / quiet
            );
        }
    }
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
