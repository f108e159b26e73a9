//! Mounts a directory through safeload-testfs for manual runs:
//!
//! ```text
//! safeload-testfs <source> [<mountpoint>] [--fsname NAME] [--subtype TYPE]
//!                 [--latency-ms MS] [--daemon-threads N | --max-concurrent N]
//!                 [--bandwidth-mib MIB_PER_SEC] [--first-byte-ms MS] [--fetch-block-kib KIB]
//!                 [--max-background N] [--direct-io] [--short-reads] [--ignore-stdin]
//! ```
//!
//! Each flag sets the `Options` field of the same name (milliseconds may have decimals;
//! `--bandwidth-mib` is in MiB per second). For example, the benchmark mounts:
//!
//! ```text
//! safeload-testfs src --latency-ms 2 --daemon-threads 8
//! safeload-testfs src --latency-ms 8 --daemon-threads 32
//! safeload-testfs src --latency-ms 2 --daemon-threads 1
//! safeload-testfs src --fsname hf-mount --daemon-threads 16 --first-byte-ms 60 \
//!                 --fetch-block-kib 32768 --bandwidth-mib 900
//! ```
//!
//! Prints the mount point (a new temporary directory when none is given) on stdout and stays
//! mounted until stdin reaches its end (Ctrl-D, or the writer of a pipe exits) or SIGINT or
//! SIGTERM arrives, then unmounts. With `--ignore-stdin` only the signals end it (for `&` in
//! a shell, where stdin is `/dev/null`).
//!
//! So that a benchmark can run the daemon in a process of its own: SIGUSR1 forgets the
//! fetched blocks (`Mount::forget_fetched`: the mount is cold again, once the page cache is
//! dropped too), and SIGUSR2 prints the counters on one line of stdout and resets them, as
//! `read_requests=N bytes_read=N max_in_flight=N max_request_bytes=N max_queued=N fetches=N
//! joined_fetches=N`.

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
                         [--subtype TYPE] [--latency-ms MS] \
                         [--daemon-threads N | --max-concurrent N] \
                         [--bandwidth-mib MIB_PER_SEC] [--first-byte-ms MS] \
                         [--fetch-block-kib KIB] [--max-background N] [--direct-io] \
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
            let millis = |name: &str, v: String| {
                v.parse::<f64>()
                    .ok()
                    .and_then(|ms| Duration::try_from_secs_f64(ms / 1000.0).ok())
                    .ok_or(format!("{name} {v}: not a number of milliseconds\n{USAGE}"))
            };
            let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
            match arg.to_str() {
                Some("--fsname") => options.fsname = value("--fsname")?,
                Some("--subtype") => options.subtype = Some(value("--subtype")?),
                Some("--latency-ms") => {
                    options.latency = Some(millis("--latency-ms", value("--latency-ms")?)?);
                }
                Some("--max-concurrent") => {
                    let n = number("--max-concurrent", value("--max-concurrent")?)?;
                    options.max_concurrent_reads = Some(count(n));
                }
                Some("--daemon-threads") => {
                    let n = number("--daemon-threads", value("--daemon-threads")?)?;
                    options.daemon_threads = Some(count(n));
                }
                Some("--bandwidth-mib") => {
                    let mib = number("--bandwidth-mib", value("--bandwidth-mib")?)?;
                    options.bandwidth_bytes_per_sec = Some(mib.saturating_mul(1 << 20));
                }
                Some("--first-byte-ms") => {
                    let delay = millis("--first-byte-ms", value("--first-byte-ms")?)?;
                    options.first_byte_delay = Some(delay);
                }
                Some("--fetch-block-kib") => {
                    let kib = number("--fetch-block-kib", value("--fetch-block-kib")?)?;
                    options.fetch_block = kib.saturating_mul(1 << 10);
                }
                Some("--max-background") => {
                    let n = number("--max-background", value("--max-background")?)?;
                    let n = u16::try_from(n)
                        .map_err(|_| format!("--max-background {n}: at most 65535\n{USAGE}"))?;
                    options.max_background = Some(n);
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

    /// Blocks SIGINT, SIGTERM, SIGUSR1 and SIGUSR2 in this thread and every thread it
    /// starts after, so that `sigwait` can take them.
    fn block_signals() -> Result<libc::sigset_t, String> {
        let mut set = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset initialises the set it is given; sigaddset and pthread_sigmask
        // get that initialised set and valid signal numbers; a null old-set is allowed.
        let rc = unsafe {
            libc::sigemptyset(set.as_mut_ptr());
            for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGUSR1, libc::SIGUSR2] {
                libc::sigaddset(set.as_mut_ptr(), signal);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, set.as_ptr(), std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(format!("pthread_sigmask: error {rc}"));
        }
        // SAFETY: sigemptyset above initialised it.
        Ok(unsafe { set.assume_init() })
    }

    /// What the main thread is asked to do, by a signal or the end of stdin.
    enum Event {
        ForgetFetched,
        PrintStats,
        Unmount,
    }

    fn print_stats(mount: &Mount) -> Result<(), String> {
        let s = mount.stats();
        mount.reset_stats();
        let mut stdout = std::io::stdout();
        writeln!(
            stdout,
            "read_requests={} bytes_read={} max_in_flight={} max_request_bytes={} \
             max_queued={} fetches={} joined_fetches={}",
            s.read_requests,
            s.bytes_read,
            s.max_in_flight,
            s.max_request_bytes,
            s.max_queued,
            s.fetches,
            s.joined_fetches
        )
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("stdout: {e}"))
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

        let (events, wait) = mpsc::channel::<Event>();
        let on_signal = events.clone();
        thread::spawn(move || {
            loop {
                let mut signal = 0;
                // SAFETY: `signals` is an initialised set and `signal` a valid place for the
                // answer.
                let rc = unsafe { libc::sigwait(&signals, &mut signal) };
                let event = match signal {
                    _ if rc != 0 => Event::Unmount,
                    libc::SIGUSR1 => Event::ForgetFetched,
                    libc::SIGUSR2 => Event::PrintStats,
                    _ => Event::Unmount,
                };
                let last = matches!(event, Event::Unmount);
                if on_signal.send(event).is_err() || last {
                    return;
                }
            }
        });
        if !args.ignore_stdin {
            thread::spawn(move || {
                let mut sink = [0; 4096];
                let mut stdin = std::io::stdin();
                while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
                let _ = events.send(Event::Unmount);
            });
        }
        let mut result = Ok(());
        while let Ok(event) = wait.recv() {
            match event {
                Event::ForgetFetched => mount.forget_fetched(),
                Event::PrintStats => {
                    if let Err(e) = print_stats(&mount) {
                        result = Err(e);
                        break;
                    }
                }
                Event::Unmount => break,
            }
        }
        drop(mount);
        result
    }
}
