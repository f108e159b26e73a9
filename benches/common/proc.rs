//! What a child reports of itself (peak and current memory, bytes read from
//! storage) and what a table says of the machine, read from `/proc`
//! (proc(5)) and `getrusage(2)`.

/// A field of `/proc/self/status` in kB (`"VmHWM:"` the peak resident set,
/// `"RssAnon:"`, `"RssFile:"`), as KiB; `None` if it is missing.
pub fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
}

/// [`status_kib`] in MiB; panics if the field is missing.
pub fn status_mib(field: &str) -> f64 {
    let kib = status_kib(field).unwrap_or_else(|| panic!("no {field} in /proc/self/status"));
    kib as f64 / 1024.0
}

/// This process's `ru_maxrss` (getrusage(2)), in KiB: the figure the load
/// benchmark's "peak RSS" column has always been (BENCHMARKS.md names it).
pub fn max_rss_kib() -> u64 {
    // SAFETY: `getrusage` writes only into the `rusage` we pass, which is
    // zeroed (a valid value of this plain C struct) and lives across the call.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) == 0 {
            usage.ru_maxrss as u64
        } else {
            0
        }
    }
}

/// This process's CPU time so far, all threads (`getrusage(2)`): user and
/// system seconds. The system time of a load is what the kernel spent for
/// it (faulting fresh memory in, copies, I/O): a figure the machine's other
/// work moves less than the wall time.
pub fn cpu_seconds() -> (f64, f64) {
    // SAFETY: `getrusage` writes only into the `rusage` we pass, which is
    // zeroed (a valid value of this plain C struct) and lives across the call.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return (f64::NAN, f64::NAN);
        }
        usage
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (seconds(usage.ru_utime), seconds(usage.ru_stime))
}

/// Bytes this process caused to be fetched from storage (`read_bytes` of
/// `/proc/self/io`); reads a FUSE daemon does for it do not count.
pub fn read_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("read_bytes:")
                    .and_then(|v| v.trim().parse().ok())
            })
        })
        .unwrap_or(0)
}

/// The machine in one line for a table's heading: CPUs, memory, kernel.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .next()
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpus} CPUs, {mem}, Linux {}", kernel.trim())
}
