//! Mounts a directory through safeload-testfs for manual runs:
//!
//! ```text
//! safeload-testfs <source> [<mountpoint>] [--fsname NAME] [--subtype TYPE]
//!                 [--latency-ms N] [--max-concurrent N] [--direct-io] [--short-reads]
//!                 [--ignore-stdin]
//! ```
//!
//! Prints the mount point (a new temporary directory when none is given) on stdout and stays
//! mounted until stdin reaches its end (Ctrl-D, or the writer of a pipe exits) or SIGINT or
//! SIGTERM arrives, then unmounts. With `--ignore-stdin` only the signals end it (for `&` in
//! a shell, where stdin is `/dev/null`).

#[cfg(target_os = "linux")]
fn main() {
    if let Err(message) = linux::run() {
        eprintln!("safeload-testfs: {message}");
        std::process::exit(2);
    }
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("safeload-testfs: Linux only");
    std::process::exit(2);
}

#[cfg(target_os = "linux")]
mod linux {
    use std::io::{Read, Write};
    use std::mem::MaybeUninit;
    use std::path::PathBuf;
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    use safeload_testfs::{Mount, Options};

    const USAGE: &str = "usage: safeload-testfs <source> [<mountpoint>] [--fsname NAME] \
                         [--subtype TYPE] [--latency-ms N] [--max-concurrent N] [--direct-io] \
                         [--short-reads] [--ignore-stdin]";

    struct Args {
        source: PathBuf,
        mount_point: Option<PathBuf>,
        options: Options,
        ignore_stdin: bool,
    }

    fn parse() -> Result<Args, String> {
        let mut args = std::env::args_os().skip(1);
        let mut positional = Vec::new();
        let mut options = Options::default();
        let mut ignore_stdin = false;
        while let Some(arg) = args.next() {
            let mut value = |name: &str| {
                args.next()
                    .and_then(|v| v.into_string().ok())
                    .ok_or(format!("{name} needs a value\n{USAGE}"))
            };
            let number = |name: &str, v: String| {
                v.parse::<u64>()
                    .map_err(|e| format!("{name} {v}: {e}\n{USAGE}"))
            };
            match arg.to_str() {
                Some("--fsname") => options.fsname = value("--fsname")?,
                Some("--subtype") => options.subtype = Some(value("--subtype")?),
                Some("--latency-ms") => {
                    let ms = number("--latency-ms", value("--latency-ms")?)?;
                    options.latency = Some(Duration::from_millis(ms));
                }
                Some("--max-concurrent") => {
                    let n = number("--max-concurrent", value("--max-concurrent")?)?;
                    options.max_concurrent_reads = Some(usize::try_from(n).unwrap_or(usize::MAX));
                }
                Some("--direct-io") => options.direct_io = true,
                Some("--short-reads") => options.short_reads = true,
                Some("--ignore-stdin") => ignore_stdin = true,
                Some("-h" | "--help") => return Err(USAGE.to_owned()),
                Some(flag) if flag.starts_with("--") => {
                    return Err(format!("unknown option {flag}\n{USAGE}"));
                }
                _ => positional.push(PathBuf::from(arg)),
            }
        }
        let mut positional = positional.into_iter();
        let source = positional.next().ok_or(USAGE)?;
        let mount_point = positional.next();
        if positional.next().is_some() {
            return Err(format!("too many arguments\n{USAGE}"));
        }
        Ok(Args {
            source,
            mount_point,
            options,
            ignore_stdin,
        })
    }

    /// Blocks SIGINT and SIGTERM in this thread and every thread it starts after, so that
    /// `sigwait` can take them.
    fn block_signals() -> Result<libc::sigset_t, String> {
        let mut set = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset initialises the set it is given; sigaddset and pthread_sigmask
        // get that initialised set and valid signal numbers; a null old-set is allowed.
        let rc = unsafe {
            libc::sigemptyset(set.as_mut_ptr());
            libc::sigaddset(set.as_mut_ptr(), libc::SIGINT);
            libc::sigaddset(set.as_mut_ptr(), libc::SIGTERM);
            libc::pthread_sigmask(libc::SIG_BLOCK, set.as_ptr(), std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(format!("pthread_sigmask: error {rc}"));
        }
        // SAFETY: sigemptyset above initialised it.
        Ok(unsafe { set.assume_init() })
    }

    pub(super) fn run() -> Result<(), String> {
        let args = parse()?;
        // Before any thread exists (the mount starts some), so they all inherit the mask.
        let signals = block_signals()?;

        let mount = match &args.mount_point {
            Some(at) => Mount::new_at(&args.source, at, args.options),
            None => Mount::new(&args.source, args.options),
        }
        .map_err(|e| e.to_string())?;
        let mut stdout = std::io::stdout();
        writeln!(stdout, "{}", mount.path().display())
            .and_then(|()| stdout.flush())
            .map_err(|e| format!("stdout: {e}"))?;

        let (done, wait) = mpsc::channel::<()>();
        let on_signal = done.clone();
        thread::spawn(move || {
            let mut signal = 0;
            // SAFETY: `signals` is an initialised set and `signal` a valid place for the answer.
            unsafe { libc::sigwait(&signals, &mut signal) };
            let _ = on_signal.send(());
        });
        if !args.ignore_stdin {
            thread::spawn(move || {
                let mut sink = [0; 4096];
                let mut stdin = std::io::stdin();
                while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
                let _ = done.send(());
            });
        }
        let _ = wait.recv();
        drop(mount);
        Ok(())
    }
}
