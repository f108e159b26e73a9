//! Another local user's process against a job's node copy: the names it
//! plants in the queue directory (as uid 65534), and the parent's handle on
//! it.
//!
//! One file for the attack tests (`attacks.rs`) and the benchmark that
//! times the same attacks (`cargo bench --bench node_copy -- --attacks`,
//! which includes this file by `#[path]`): both play exactly these attacks.
//! So it uses only `std`, `rustix` and `libc`, none of the test helpers.
//!
//! The protocol: the parent starts its own binary again as the attacker
//! ([`Attacker::spawn`], which sets the variables [`act_from_env`] reads);
//! the attacker becomes uid 65534, plants its names and prints them, then
//! keeps them until the parent's word ([`Attacker::release`]), and removes
//! them.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

/// Which attack the attacker plays (a name of [`Attack::name`]).
const ATTACK: &str = "SAFELOAD_TEST_NODE_ATTACK";
/// The key of the copy attacked, in hex (learned from an earlier run).
const KEY: &str = "SAFELOAD_TEST_NODE_KEY";
/// The uid whose lock file the attacker takes or waits for.
const VICTIM_UID: &str = "SAFELOAD_TEST_NODE_VICTIM_UID";
/// The queue directory the attacker plants its names in.
const ATTACK_DIR: &str = "SAFELOAD_TEST_NODE_ATTACK_DIR";
/// The attacker's uid (`nobody`).
pub const ATTACKER: u32 = 65534;

/// An attack by another local user who has learned a copy's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attack {
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
    pub const ALL: [Attack; 8] = [
        Attack::Silent,
        Attack::Backlog,
        Attack::File,
        Attack::Fifo,
        Attack::Symlink,
        Attack::Lock,
        Attack::Queue,
        Attack::Late,
    ];

    pub fn name(self) -> &'static str {
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

    pub fn parse(name: &str) -> Option<Attack> {
        Attack::ALL.into_iter().find(|a| a.name() == name)
    }

    /// What a rank that met the attack says in each file's note.
    pub fn reason(self) -> String {
        let kind = match self {
            Attack::Silent | Attack::Backlog | Attack::Late => "a socket",
            Attack::File | Attack::Lock | Attack::Queue => "a file",
            Attack::Fifo => "a FIFO",
            Attack::Symlink => "a symlink",
        };
        format!("{kind} of uid {ATTACKER}, not this user's")
    }
}

/// What the attacker is told: the attack, the queue directory, the key it
/// learned (unused by [`Attack::Late`], which waits for the lock file) and
/// the victim's uid.
#[derive(Debug, Clone)]
pub struct Target {
    pub attack: Attack,
    pub dir: PathBuf,
    pub key: u64,
    pub victim: u32,
}

// ---------------------------------------------------------------------------
// The attacker's side.

/// The attacker's process: plays the attack its variables name as uid
/// 65534, prints `ATTACK-WATCHING` (the late listener, before it looks for
/// the lock file), `ATTACK-READY`, the names it made and `ATTACK-END`, then
/// keeps them until a line arrives on stdin, and removes them.
pub fn act_from_env() {
    let attack = Attack::parse(&std::env::var(ATTACK).unwrap()).unwrap();
    let dir = PathBuf::from(std::env::var(ATTACK_DIR).unwrap());
    let victim: u32 = std::env::var(VICTIM_UID).unwrap().parse().unwrap();
    become_user(ATTACKER);
    let (me, dead) = (own_word(), dead_word());
    let key = if attack == Attack::Late {
        println!("ATTACK-WATCHING");
        std::io::stdout().flush().unwrap();
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

/// `setgid` and `setuid` to `uid` (also what a victim's rank of another
/// user does before it loads).
pub fn become_user(uid: u32) {
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

/// The key of a lock file of `uid` in `dir` (`safeload-node-<key>-u<uid>.lock`,
/// the name every user can read), if there is one.
pub fn lock_key(dir: &Path, uid: u32) -> Option<u64> {
    let suffix = format!("-u{uid}.lock");
    std::fs::read_dir(dir).ok()?.flatten().find_map(|entry| {
        let name = entry.file_name().to_string_lossy().into_owned();
        let key = name.strip_prefix("safeload-node-")?.strip_suffix(&suffix)?;
        u64::from_str_radix(key, 16).ok()
    })
}

/// The key of the first lock file of `uid` to appear in `dir` (polled
/// every millisecond, for at most a minute).
fn wait_for_lock(dir: &Path, uid: u32) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Some(key) = lock_key(dir, uid) {
            return key;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("no lock file of uid {uid} appeared");
}

// ---------------------------------------------------------------------------
// The parent's side.

/// A running attacker. Killed if dropped before [`Attacker::release`].
pub struct Attacker {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Attacker {
    /// Starts `command` (this binary again, in its attacker role) as the
    /// attacker of `target`, its stdin and stdout piped.
    pub fn spawn(mut command: Command, target: &Target) -> std::io::Result<Attacker> {
        command
            .env(ATTACK, target.attack.name())
            .env(KEY, format!("{:016x}", target.key))
            .env(VICTIM_UID, target.victim.to_string())
            .env(ATTACK_DIR, &target.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = command.spawn()?;
        let out = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Attacker { child, out })
    }

    /// Waits until the late listener looks for the lock file (the
    /// benchmark lets the first rank go then; the tests start it at once).
    #[allow(dead_code)]
    pub fn watching(&mut self) -> Result<(), String> {
        self.read_until(|line| line.ends_with("ATTACK-WATCHING"))
            .map(drop)
    }

    /// Waits until the attacker is ready; the names it made.
    pub fn planted(&mut self) -> Result<Vec<PathBuf>, String> {
        let mut names = Vec::new();
        self.read_until(|line| {
            if let Some((_, name)) = line.split_once("ATTACK-NAME ") {
                names.push(PathBuf::from(name));
            }
            line.ends_with("ATTACK-END")
        })?;
        Ok(names)
    }

    /// Reads lines (a test harness may print before them on a line) until
    /// `last` says one is the last.
    fn read_until(&mut self, mut last: impl FnMut(&str) -> bool) -> Result<(), String> {
        let mut line = String::new();
        loop {
            line.clear();
            match self.out.read_line(&mut line) {
                Ok(0) => return Err("the attacker ended".into()),
                Ok(_) if last(line.trim_end()) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(format!("reading the attacker: {e}")),
            }
        }
    }

    /// Tells the attacker to remove its names and end; its exit status.
    pub fn release(mut self) -> std::io::Result<ExitStatus> {
        writeln!(self.child.stdin.as_mut().expect("piped"), "go")?;
        self.child.wait()
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
