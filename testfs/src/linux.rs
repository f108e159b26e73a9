//! Mounting and unmounting on Linux: fuser's pure-Rust mount, `umount2(2)`, `fusermount3`.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use fuser::{BackgroundSession, Config, MountOption};

use crate::fs::TestFs;
use crate::{Options, Shared};

/// A running session: fuser's handle on the mount and its session thread.
pub(crate) type Session = BackgroundSession;

/// How long `Drop` waits for the session thread after a clean unmount.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);

const FUSERMOUNTS: [&str; 2] = ["fusermount3", "fusermount"];

pub(crate) fn can_mount() -> Result<(), String> {
    let dev = Path::new("/dev/fuse");
    if !dev.exists() {
        return Err(
            "/dev/fuse does not exist (load the fuse module, or give the container \
                    --device /dev/fuse)"
                .to_owned(),
        );
    }
    // fuser opens /dev/fuse itself before it tries mount(2), and only falls back to the
    // setuid fusermount3 when mount(2) is refused: so everyone needs it open.
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dev)
        .map_err(|e| format!("cannot open /dev/fuse: {e}"))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root && fusermount().is_none() {
        return Err("not root, and neither fusermount3 nor fusermount is on PATH".to_owned());
    }
    Ok(())
}

pub(crate) fn mount(
    source: &Path,
    mount_point: &Path,
    options: &Options,
    shared: Arc<Shared>,
) -> io::Result<Session> {
    let mut mount_options = vec![
        MountOption::RO,
        MountOption::FSName(options.fsname.clone()),
        MountOption::DefaultPermissions,
    ];
    if let Some(subtype) = &options.subtype {
        // fuser's `Subtype` goes to fusermount3 only; as root it mounts with mount(2) and
        // drops it. `subtype=` as a kernel option works on both paths.
        mount_options.push(MountOption::CUSTOM(format!("subtype={subtype}")));
    }
    let mut config = Config::default();
    config.mount_options = mount_options;
    let fs = TestFs::new(source, options, shared)?;
    fuser::spawn_mount(fs, mount_point, &config)
}

/// Writes the readahead of the mount's backing device info (root only).
pub(crate) fn set_read_ahead_kb(mount_point: &Path, kb: u32) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;

    let dev = std::fs::metadata(mount_point)?.dev();
    let knob = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    std::fs::write(&knob, format!("{kb}\n"))
        .map_err(|e| io::Error::new(e.kind(), format!("{knob}: {e}")))
}

/// Unmounts and lets the session end. Never blocks for long: a busy mount is detached lazily
/// and its session thread left to finish when the last open file on it closes.
pub(crate) fn unmount(session: Session, mount_point: &Path) {
    match unmount_path(mount_point) {
        Ok(Unmounted::Clean) => {
            // The kernel has ended the connection; the session thread sees that and exits.
            let deadline = Instant::now() + JOIN_TIMEOUT;
            while !session.guard.is_finished() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(1));
            }
            if session.guard.is_finished() {
                if let Err(e) = session.join() {
                    eprintln!(
                        "safeload-testfs: session of {} ended with: {e}",
                        mount_point.display()
                    );
                }
            } else {
                eprintln!(
                    "safeload-testfs: session thread of {} still running after unmount; leaving it",
                    mount_point.display()
                );
            }
        }
        Ok(Unmounted::Lazy) => drop(session),
        Err(e) => {
            eprintln!(
                "safeload-testfs: cannot unmount {}: {e}",
                mount_point.display()
            );
            drop(session);
        }
    }
}

enum Unmounted {
    /// Gone, and the connection with it.
    Clean,
    /// Detached from the tree; the connection lives on while files on it are open.
    Lazy,
}

fn unmount_path(mount_point: &Path) -> Result<Unmounted, String> {
    let path = CString::new(mount_point.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    match umount2(&path, 0) {
        Ok(()) => return Ok(Unmounted::Clean),
        // Not a mount point any more: unmounted from outside.
        Err(libc::EINVAL) => return Ok(Unmounted::Clean),
        Err(libc::EBUSY) => {
            if umount2(&path, libc::MNT_DETACH).is_ok() {
                return Ok(Unmounted::Lazy);
            }
        }
        Err(_) => {}
    }
    // Not allowed to unmount ourselves (not root): the setuid helper is.
    if let Some(bin) = fusermount() {
        if run(Command::new(bin).args(["-u", "-q", "--"]).arg(mount_point)) {
            return Ok(Unmounted::Clean);
        }
        if run(Command::new(bin)
            .args(["-u", "-q", "-z", "--"])
            .arg(mount_point))
        {
            return Ok(Unmounted::Lazy);
        }
    }
    if run(Command::new("umount").arg("-l").arg(mount_point)) {
        return Ok(Unmounted::Lazy);
    }
    Err("umount2, fusermount3 -u and umount -l all failed".to_owned())
}

/// `umount2(2)`, returning the errno on failure.
fn umount2(path: &CString, flags: libc::c_int) -> Result<(), libc::c_int> {
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
    let rc = unsafe { libc::umount2(path.as_ptr(), flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// The first of `fusermount3` and `fusermount` that runs.
fn fusermount() -> Option<&'static str> {
    FUSERMOUNTS
        .into_iter()
        .find(|bin| run(Command::new(bin).arg("-V")))
}

/// Runs `command` silently; whether it ran and succeeded.
fn run(command: &mut Command) -> bool {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
