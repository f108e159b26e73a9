//! End-to-end tests: each mounts a temporary tree and reads it back through the kernel.
//!
//! They need FUSE (root, or fusermount3, and /dev/fuse); without it they print
//! `SKIPPED: <reason>` and pass, unless `SAFELOAD_REQUIRE_FUSE=1`.

use std::fs::{self, File};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use safeload_testfs::{Mount, Options, skip_without_fuse};

const MIB: usize = 1024 * 1024;

/// Deterministic, incompressible-looking bytes (xorshift, eight bytes a step, so that tests
/// can make tens of MiB quickly in debug builds), different per seed.
fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A source tree:
///
/// ```text
/// big.bin              3 MiB + 123 bytes
/// small.txt            "hello\n"
/// empty                0 bytes
/// nested/deeper/b.bin  100 KiB
/// link        -> nested/deeper/b.bin
/// nested_link -> nested
/// ```
struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    fn new() -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::write(root.join("big.bin"), bytes(3 * MIB + 123, 1)).unwrap();
        fs::write(root.join("small.txt"), b"hello\n").unwrap();
        fs::write(root.join("empty"), b"").unwrap();
        fs::create_dir_all(root.join("nested/deeper")).unwrap();
        fs::write(root.join("nested/deeper/b.bin"), bytes(100 * 1024, 2)).unwrap();
        std::os::unix::fs::symlink("nested/deeper/b.bin", root.join("link")).unwrap();
        std::os::unix::fs::symlink("nested", root.join("nested_link")).unwrap();
        Tree { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

struct MountInfo {
    mount_point: PathBuf,
    options: String,
    fstype: String,
    source: String,
}

/// `\040` and friends in /proc/self/mountinfo.
fn unescape(field: &str) -> String {
    let mut out = Vec::new();
    let b = field.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let octal = std::str::from_utf8(&b[i + 1..i + 4]).unwrap();
            out.push(u8::from_str_radix(octal, 8).unwrap());
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

fn mountinfo() -> Vec<MountInfo> {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let right: Vec<&str> = right.split(' ').collect();
            Some(MountInfo {
                mount_point: PathBuf::from(unescape(left.get(4)?)),
                options: left.get(5)?.to_string(),
                fstype: unescape(right.first()?),
                source: unescape(right.get(1)?),
            })
        })
        .collect()
}

fn find_mount(path: &Path) -> Option<MountInfo> {
    mountinfo().into_iter().find(|m| m.mount_point == path)
}

#[test]
fn passthrough_reads_identical_bytes() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    let mount = Mount::new(tree.path(), Options::default()).unwrap();
    let m = mount.path();

    for file in ["big.bin", "small.txt", "empty", "nested/deeper/b.bin"] {
        let want = fs::read(tree.path().join(file)).unwrap();
        assert_eq!(fs::read(m.join(file)).unwrap(), want, "{file}");
        let (src, mounted) = (
            fs::metadata(tree.path().join(file)).unwrap(),
            fs::metadata(m.join(file)).unwrap(),
        );
        assert_eq!(mounted.len(), src.len(), "{file}");
        assert_eq!(mounted.mode(), src.mode(), "{file}");
        assert_eq!(
            mounted.modified().unwrap(),
            src.modified().unwrap(),
            "{file}"
        );
        assert_eq!(
            fs::metadata(m.join(file)).unwrap().ino(),
            mounted.ino(),
            "{file}"
        );
    }

    // Positional reads at odd offsets.
    let big = fs::read(tree.path().join("big.bin")).unwrap();
    let f = File::open(m.join("big.bin")).unwrap();
    let mut buf = vec![0; 300_001];
    f.read_exact_at(&mut buf, 1_234_567).unwrap();
    assert_eq!(buf, big[1_234_567..1_234_567 + 300_001]);

    // Symlinks stay symlinks, and resolve inside the mount.
    assert!(fs::symlink_metadata(m.join("link")).unwrap().is_symlink());
    assert_eq!(
        fs::read_link(m.join("link")).unwrap(),
        Path::new("nested/deeper/b.bin")
    );
    assert_eq!(
        fs::read(m.join("link")).unwrap(),
        fs::read(tree.path().join("nested/deeper/b.bin")).unwrap()
    );
    assert_eq!(
        fs::read(m.join("nested_link/deeper/b.bin")).unwrap(),
        fs::read(tree.path().join("nested/deeper/b.bin")).unwrap()
    );

    // Directory listings.
    let names = |dir: &Path| {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(m), names(tree.path()));
    assert_eq!(names(&m.join("nested")), names(&tree.path().join("nested")));
    assert!(fs::metadata(m.join("nested/deeper")).unwrap().is_dir());

    // Read-only.
    let err = File::create(m.join("new")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    let err = fs::OpenOptions::new()
        .write(true)
        .open(m.join("small.txt"))
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    let err = fs::remove_file(m.join("small.txt")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");

    let stats = mount.stats();
    assert!(stats.read_requests > 0, "{stats:?}");
    assert!(stats.bytes_read >= big.len() as u64, "{stats:?}");
    assert!(stats.max_request_bytes > 0, "{stats:?}");
}

#[test]
fn mountinfo_shows_fsname_and_type() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();

    let plain = Mount::new(
        tree.path(),
        Options {
            fsname: "hf-mount".into(),
            ..Options::default()
        },
    )
    .unwrap();
    let info = find_mount(plain.path()).expect("mount listed in /proc/self/mountinfo");
    assert_eq!(info.source, "hf-mount");
    assert_eq!(info.fstype, "fuse");
    assert!(
        info.options.split(',').any(|o| o == "ro"),
        "{}",
        info.options
    );

    let typed = Mount::new(
        tree.path(),
        Options {
            fsname: "hf-mount".into(),
            subtype: Some("hf-mount".into()),
            ..Options::default()
        },
    )
    .unwrap();
    let info = find_mount(typed.path()).expect("mount listed in /proc/self/mountinfo");
    assert_eq!(info.source, "hf-mount");
    assert_eq!(info.fstype, "fuse.hf-mount");

    let default = Mount::new(tree.path(), Options::default()).unwrap();
    assert_eq!(
        find_mount(default.path()).unwrap().source,
        "safeload-testfs"
    );
}

/// Four threads start a 64 KiB read each at the same moment, on `file` at offsets
/// 0, 64 Ki, 128 Ki, 192 Ki.
fn four_parallel_reads(path: &Path) {
    let barrier = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..4u64)
        .map(|i| {
            let (barrier, path) = (Arc::clone(&barrier), path.to_owned());
            thread::spawn(move || {
                let f = File::open(path).unwrap();
                let mut buf = vec![0; 64 * 1024];
                barrier.wait();
                f.read_exact_at(&mut buf, i * 64 * 1024).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn max_concurrent_reads_one_serializes() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    let latency = Duration::from_millis(20);
    let mount = Mount::new(
        tree.path(),
        Options {
            latency: Some(latency),
            max_concurrent_reads: Some(1),
            direct_io: true,
            ..Options::default()
        },
    )
    .unwrap();
    let start = Instant::now();
    four_parallel_reads(&mount.path().join("big.bin"));
    let elapsed = start.elapsed();
    let stats = mount.stats();
    assert_eq!(stats.max_in_flight, 1, "{stats:?}");
    assert_eq!(stats.read_requests, 4, "{stats:?}");
    assert_eq!(stats.max_request_bytes, 64 * 1024, "{stats:?}");
    assert!(elapsed >= latency * 4, "{elapsed:?}");
}

#[test]
fn unlimited_reads_overlap() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    let latency = Duration::from_millis(50);
    let mount = Mount::new(
        tree.path(),
        Options {
            latency: Some(latency),
            direct_io: true,
            ..Options::default()
        },
    )
    .unwrap();
    let start = Instant::now();
    four_parallel_reads(&mount.path().join("big.bin"));
    let elapsed = start.elapsed();
    let stats = mount.stats();
    assert!(stats.max_in_flight > 1, "{stats:?}");
    assert!(elapsed < latency * 4, "{elapsed:?}");
}

#[test]
fn unlimited_reads_overlap_through_the_page_cache() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    for i in 0..4 {
        fs::write(tree.path().join(format!("f{i}")), bytes(64 * 1024, 10 + i)).unwrap();
    }
    let mount = Mount::new(
        tree.path(),
        Options {
            latency: Some(Duration::from_millis(50)),
            ..Options::default()
        },
    )
    .unwrap();
    let barrier = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let barrier = Arc::clone(&barrier);
            let path = mount.path().join(format!("f{i}"));
            thread::spawn(move || {
                let mut f = File::open(path).unwrap();
                barrier.wait();
                let mut out = Vec::new();
                f.read_to_end(&mut out).unwrap();
                out
            })
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        assert_eq!(t.join().unwrap(), bytes(64 * 1024, 10 + i as u64));
    }
    let stats = mount.stats();
    assert!(stats.max_in_flight > 1, "{stats:?}");
}

#[test]
fn short_reads_reach_the_application() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    let mount = Mount::new(
        tree.path(),
        Options {
            short_reads: true,
            ..Options::default()
        },
    )
    .unwrap();
    let want = fs::read(tree.path().join("big.bin")).unwrap();
    let f = File::open(mount.path().join("big.bin")).unwrap();
    let mut buf = vec![0; 64 * 1024];
    let n = f.read_at(&mut buf, 1000).unwrap();
    assert!(n > 0 && n < buf.len(), "read_at returned {n}");
    assert_eq!(buf[..n], want[1000..1000 + n]);

    // A loop that reads to the end still gets everything.
    let mut got = Vec::new();
    File::open(mount.path().join("big.bin"))
        .unwrap()
        .read_to_end(&mut got)
        .unwrap();
    assert_eq!(got, want);

    // Switched off, files opened afterwards read in full.
    mount.set_short_reads(false);
    let f = File::open(mount.path().join("big.bin")).unwrap();
    assert_eq!(f.read_at(&mut buf, 1000).unwrap(), buf.len());
}

#[test]
fn eio_at_fails_reads_covering_the_offset() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    let mount = Mount::new(
        tree.path(),
        Options {
            eio_at: Some(("nested/deeper/b.bin".into(), 50_000)),
            direct_io: true,
            ..Options::default()
        },
    )
    .unwrap();
    let want = fs::read(tree.path().join("nested/deeper/b.bin")).unwrap();
    let f = File::open(mount.path().join("nested/deeper/b.bin")).unwrap();
    let mut buf = vec![0; 4096];

    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, want[..4096]);
    // Ends exactly at the bad offset: fine.
    f.read_exact_at(&mut buf, 50_000 - 4096).unwrap();
    let err = f.read_at(&mut buf, 49_000).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let err = f.read_at(&mut buf, 50_000).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    f.read_exact_at(&mut buf, 50_001).unwrap();
    // Another file is unaffected.
    File::open(mount.path().join("big.bin"))
        .unwrap()
        .read_exact_at(&mut buf, 49_000)
        .unwrap();

    mount.set_eio_at(None);
    f.read_exact_at(&mut buf, 49_000).unwrap();
    assert_eq!(buf, want[49_000..49_000 + 4096]);
}

#[test]
fn eio_at_through_the_page_cache() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    let mount = Mount::new(
        tree.path(),
        Options {
            eio_at: Some(("./big.bin".into(), 2 * MIB as u64)),
            ..Options::default()
        },
    )
    .unwrap();
    let f = File::open(mount.path().join("big.bin")).unwrap();
    let mut buf = vec![0; 4096];
    f.read_exact_at(&mut buf, 0).unwrap();
    // The page cache hands out the pages before the bad one first (a short read), then the
    // failed page answers EIO.
    assert_eq!(f.read_at(&mut buf, 2 * MIB as u64 - 100).unwrap(), 100);
    let err = f.read_exact_at(&mut buf, 2 * MIB as u64 - 100).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
}

#[test]
fn reset_stats_zeroes_counters() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    let mount = Mount::new(
        tree.path(),
        Options {
            direct_io: true,
            ..Options::default()
        },
    )
    .unwrap();
    let f = File::open(mount.path().join("big.bin")).unwrap();
    let mut buf = vec![0; 10_000];
    f.read_exact_at(&mut buf, 0).unwrap();
    let stats = mount.stats();
    assert_eq!(stats.read_requests, 1, "{stats:?}");
    assert_eq!(stats.bytes_read, 10_000, "{stats:?}");
    assert_eq!(stats.max_request_bytes, 10_000, "{stats:?}");
    assert_eq!(stats.max_in_flight, 1, "{stats:?}");
    mount.reset_stats();
    assert_eq!(mount.stats(), safeload_testfs::Stats::default());
}

#[test]
fn drop_unmounts_and_removes_the_mount_point() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    let mount = Mount::new(tree.path(), Options::default()).unwrap();
    let path = mount.path().to_owned();
    assert!(find_mount(&path).is_some());
    drop(mount);
    assert!(find_mount(&path).is_none());
    assert!(!path.exists());
}

#[test]
fn panicking_test_leaves_no_mount() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    let mut path = PathBuf::new();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mount = Mount::new(tree.path(), Options::default()).unwrap();
        path = mount.path().to_owned();
        fs::read(mount.path().join("small.txt")).unwrap();
        panic!("test failure while mounted");
    }));
    assert!(result.is_err());
    assert!(find_mount(&path).is_none());
    assert!(!path.exists());
}

#[test]
fn drop_while_a_file_is_open_does_not_block() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    let mount = Mount::new(tree.path(), Options::default()).unwrap();
    let path = mount.path().to_owned();
    let f = File::open(mount.path().join("small.txt")).unwrap();
    let start = Instant::now();
    drop(mount);
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(find_mount(&path).is_none());
    // The detached mount still serves the open file.
    let mut buf = [0; 6];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"hello\n");
}

#[test]
fn mmap_of_a_direct_io_file_works() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    let mount = Mount::new(
        tree.path(),
        Options {
            direct_io: true,
            ..Options::default()
        },
    )
    .unwrap();
    let want = fs::read(tree.path().join("nested/deeper/b.bin")).unwrap();
    let f = File::open(mount.path().join("nested/deeper/b.bin")).unwrap();
    let len = want.len();
    // SAFETY: a fresh read-only shared mapping of `len` bytes of an open file; unmapped below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    // SAFETY: the mapping is `len` readable bytes and nobody writes the file.
    let mapped = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    assert_eq!(mapped, &want[..]);
    // SAFETY: `ptr`/`len` are the mapping made above; `mapped` is not used after this.
    unsafe { libc::munmap(ptr, len) };
}

#[test]
fn invalid_options_are_rejected() {
    let tree = Tree::new();
    let err = Mount::new(
        tree.path(),
        Options {
            max_concurrent_reads: Some(0),
            ..Options::default()
        },
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let err = Mount::new(
        tree.path(),
        Options {
            fsname: "a,b".into(),
            ..Options::default()
        },
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    for options in [
        Options {
            daemon_threads: Some(0),
            ..Options::default()
        },
        Options {
            daemon_threads: Some(4),
            max_concurrent_reads: Some(4),
            ..Options::default()
        },
        Options {
            bandwidth_bytes_per_sec: Some(0),
            ..Options::default()
        },
        Options {
            fetch_block: 0,
            ..Options::default()
        },
        Options {
            max_background: Some(0),
            ..Options::default()
        },
    ] {
        let err = Mount::new(tree.path(), options.clone()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{options:?}");
    }
    let err = Mount::new(&tree.path().join("missing"), Options::default()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.to_string().contains("missing"), "{err}");
    let err = Mount::new(&tree.path().join("small.txt"), Options::default()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotADirectory);
}

#[test]
fn raised_readahead_makes_larger_requests() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    let mount = Mount::new(tree.path(), Options::default()).unwrap();
    if let Err(e) = mount.set_read_ahead_kb(1024) {
        // Not root, or sysfs read-only: nothing to test here.
        eprintln!("SKIPPED: cannot set read_ahead_kb: {e}");
        return;
    }
    let mut f = File::open(mount.path().join("big.bin")).unwrap();
    let mut buf = vec![0; 64 * 1024];
    while f.read(&mut buf).unwrap() > 0 {}
    let stats = mount.stats();
    assert!(stats.max_request_bytes > 128 * 1024, "{stats:?}");
}

#[test]
fn large_directory_lists_fully() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    let dir = tree.path().join("many");
    fs::create_dir(&dir).unwrap();
    for i in 0..2000 {
        fs::write(dir.join(format!("file-with-a-longish-name-{i:05}")), b"x").unwrap();
    }
    let mount = Mount::new(tree.path(), Options::default()).unwrap();
    let mut names: Vec<_> = fs::read_dir(mount.path().join("many"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let want: Vec<_> = (0..2000)
        .map(|i| format!("file-with-a-longish-name-{i:05}"))
        .collect();
    assert_eq!(names, want);
}

#[test]
fn mount_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Mount>();
}

/// A page-aligned buffer of `len` bytes inside `storage`: an `O_DIRECT` read into an
/// unaligned buffer reaches the filesystem as two `READ`s, split where the buffer's pages
/// fall, so that counts of requests would be off.
fn aligned(storage: &mut Vec<u8>, len: usize) -> &mut [u8] {
    storage.resize(len + 4096, 0);
    let start = storage.as_ptr().align_offset(4096);
    &mut storage[start..start + len]
}

/// `clients` threads, started together, each read `per_client` chunks of 1 MiB of `path`
/// with `O_DIRECT` (so one `READ` each, never served from the page cache), chunk
/// `(client * per_client + k) % chunks`, and check them against `want`, the file's bytes.
/// Returns how long they took.
fn read_direct_chunks(
    path: &Path,
    want: &Arc<Vec<u8>>,
    clients: usize,
    per_client: usize,
) -> Duration {
    let chunks = want.len() / MIB;
    let barrier = Arc::new(Barrier::new(clients + 1));
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let (barrier, path, want) = (Arc::clone(&barrier), path.to_owned(), Arc::clone(want));
            thread::spawn(move || {
                let f = fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(path)
                    .unwrap();
                let mut storage = Vec::new();
                let buf = aligned(&mut storage, MIB);
                barrier.wait();
                for k in 0..per_client {
                    let chunk = (c * per_client + k) % chunks;
                    f.read_exact_at(buf, (chunk * MIB) as u64).unwrap();
                    assert!(buf[..] == want[chunk * MIB..][..MIB], "chunk {chunk}");
                }
            })
        })
        .collect();
    // Taken before the readers are let go, so that no read can start before it: lower bounds
    // on the time hold exactly.
    let start = Instant::now();
    barrier.wait();
    for t in threads {
        t.join().unwrap();
    }
    start.elapsed()
}

/// A source tree with `chunks.bin` of `mib` MiB; its bytes.
fn chunks_file(tree: &Tree, mib: usize) -> Arc<Vec<u8>> {
    let want = bytes(mib * MIB, 7);
    fs::write(tree.path().join("chunks.bin"), &want).unwrap();
    Arc::new(want)
}

/// The kernel's view of a FUSE connection, from the fusectl filesystem
/// (`/sys/fs/fuse/connections/<device>/`, see the kernel's
/// Documentation/filesystems/fuse.rst); `None` when fusectl is not mounted.
fn connection_setting(mount: &Mount, name: &str) -> Option<u32> {
    let dev = fs::metadata(mount.path()).unwrap().dev();
    // The directory is named after the kernel's dev_t: major << 20 | minor.
    let id = (libc::major(dev) << 20) | libc::minor(dev);
    let text = fs::read_to_string(format!("/sys/fs/fuse/connections/{id}/{name}")).ok()?;
    Some(text.trim().parse().unwrap())
}

/// With `threads` daemon threads and `latency`, `2 * threads` clients reading 1 MiB
/// chunks see exactly `threads` requests served at once, the rest queued in the daemon, and
/// take at least `requests / threads * latency`, less than serialized. The latency is long
/// next to the copy of 1 MiB (under a millisecond), so that a busy machine still keeps every
/// thread fed.
fn check_daemon_threads(threads: usize, latency: Duration, requests: usize) {
    let tree = Tree::new();
    let want = chunks_file(&tree, 8);
    let mount = Mount::new(
        tree.path(),
        Options {
            latency: Some(latency),
            daemon_threads: Some(threads),
            ..Options::default()
        },
    )
    .unwrap();
    let clients = 2 * threads;
    let elapsed = read_direct_chunks(
        &mount.path().join("chunks.bin"),
        &want,
        clients,
        requests / clients,
    );
    let stats = mount.stats();
    assert_eq!(stats.read_requests, requests as u64, "{stats:?}");
    assert_eq!(stats.max_request_bytes, MIB as u64, "{stats:?}");
    assert_eq!(stats.max_in_flight, threads as u64, "{stats:?}");
    // The kernel had more requests out than there are threads: they waited in the daemon.
    assert!(stats.max_queued > 0, "{stats:?}");
    // Each thread serves its share one after another, each taking the latency.
    let rounds = requests.div_ceil(threads) as u32;
    assert!(
        elapsed >= latency * rounds,
        "{elapsed:?} for {rounds} rounds"
    );
    // `max_in_flight` shows the threads at work together; the time, loosely (the machine
    // may be busy copying), agrees: less than one thread would take.
    assert!(elapsed < latency * requests as u32, "{elapsed:?}");
    // Enough asynchronous requests for every thread, and one queued behind each.
    if let Some(max_background) = connection_setting(&mount, "max_background") {
        assert!(max_background as usize >= 2 * threads, "{max_background}");
    }
}

#[test]
fn daemon_threads_8_bound_requests_in_flight() {
    if skip_without_fuse() {
        return;
    }
    check_daemon_threads(8, Duration::from_millis(20), 64);
}

#[test]
fn daemon_threads_32_bound_requests_in_flight() {
    if skip_without_fuse() {
        return;
    }
    check_daemon_threads(32, Duration::from_millis(20), 128);
}

#[test]
fn one_daemon_thread_serializes() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    let want = chunks_file(&tree, 4);
    let latency = Duration::from_millis(5);
    let mount = Mount::new(
        tree.path(),
        Options {
            latency: Some(latency),
            daemon_threads: Some(1),
            ..Options::default()
        },
    )
    .unwrap();
    let elapsed = read_direct_chunks(&mount.path().join("chunks.bin"), &want, 4, 4);
    let stats = mount.stats();
    assert_eq!(stats.max_in_flight, 1, "{stats:?}");
    assert_eq!(stats.read_requests, 16, "{stats:?}");
    assert!(elapsed >= latency * 16, "{elapsed:?}");
}

/// The `max_background` asked for in `INIT` is what the kernel applies (read back from
/// fusectl, where it is mounted), twice the daemon threads by default when that is above 64.
#[test]
fn max_background_reaches_the_kernel() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    let mount = |daemon_threads, max_background| {
        Mount::new(
            tree.path(),
            Options {
                daemon_threads,
                max_background,
                ..Options::default()
            },
        )
        .unwrap()
    };
    let cases = [
        (None, None, 64),
        (Some(32), None, 64),
        (Some(100), None, 200),
        (Some(8), Some(8), 8),
        (None, Some(256), 256),
    ];
    for (daemon_threads, max_background, want) in cases {
        let mount = mount(daemon_threads, max_background);
        let Some(set) = connection_setting(&mount, "max_background") else {
            eprintln!("SKIPPED: fusectl is not mounted at /sys/fs/fuse/connections");
            return;
        };
        assert_eq!(set, want, "{daemon_threads:?} {max_background:?}");
        assert_eq!(
            connection_setting(&mount, "congestion_threshold"),
            Some(want / 4 * 3)
        );
    }
}

/// Reads through the page cache are readahead, asynchronous requests, which the kernel holds
/// to `max_background`: with the default for 32 threads, 32 readers keep all of them busy.
#[test]
fn readahead_keeps_32_daemon_threads_busy() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    let want = chunks_file(&tree, 8);
    // Long enough for 32 readers to be all in, even on a busy machine.
    let mount = Mount::new(
        tree.path(),
        Options {
            latency: Some(Duration::from_millis(50)),
            daemon_threads: Some(32),
            ..Options::default()
        },
    )
    .unwrap();
    let piece = 256 * 1024;
    let barrier = Arc::new(Barrier::new(32));
    let threads: Vec<_> = (0..32)
        .map(|i| {
            let (barrier, want) = (Arc::clone(&barrier), Arc::clone(&want));
            let path = mount.path().join("chunks.bin");
            thread::spawn(move || {
                let f = File::open(path).unwrap();
                let mut buf = vec![0; piece];
                barrier.wait();
                f.read_exact_at(&mut buf, (i * piece) as u64).unwrap();
                assert!(buf[..] == want[i * piece..][..piece]);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = mount.stats();
    assert_eq!(stats.max_in_flight, 32, "{stats:?}");
}

#[test]
fn bandwidth_caps_throughput() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    let want = chunks_file(&tree, 8);
    let rate = 64 * MIB as u64;
    let mount = Mount::new(
        tree.path(),
        Options {
            daemon_threads: Some(8),
            bandwidth_bytes_per_sec: Some(rate),
            ..Options::default()
        },
    )
    .unwrap();
    // 32 MiB from 8 clients at once.
    let elapsed = read_direct_chunks(&mount.path().join("chunks.bin"), &want, 8, 4);
    let stats = mount.stats();
    assert_eq!(stats.bytes_read, 32 * MIB as u64, "{stats:?}");
    // The link carries 32 MiB in 0.5 s, and no answer leaves before its last byte crossed.
    assert!(elapsed >= Duration::from_millis(500), "{elapsed:?}");
    // And it carries about that much rather than idling (loosely: the machine may be busy).
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
}

/// One 64 KiB `O_DIRECT` read at `offset`; how long it took.
fn timed_read(f: &File, offset: u64) -> Duration {
    let mut storage = Vec::new();
    let buf = aligned(&mut storage, 64 * 1024);
    let start = Instant::now();
    f.read_exact_at(buf, offset).unwrap();
    start.elapsed()
}

#[test]
fn first_byte_delay_is_paid_once_per_block() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    fs::write(tree.path().join("blocks.bin"), bytes(8 * MIB, 3)).unwrap();
    let delay = Duration::from_millis(60);
    let mount = Mount::new(
        tree.path(),
        Options {
            daemon_threads: Some(4),
            first_byte_delay: Some(delay),
            fetch_block: MIB as u64,
            direct_io: true,
            ..Options::default()
        },
    )
    .unwrap();
    let f = File::open(mount.path().join("blocks.bin")).unwrap();
    let block = MIB as u64;
    for i in 0..3 {
        assert!(timed_read(&f, i * block) >= delay, "block {i}");
        // The rest of a fetched block is there: same count, whatever the time.
        timed_read(&f, i * block + block / 2);
        timed_read(&f, i * block + block - 64 * 1024);
    }
    let stats = mount.stats();
    assert_eq!(stats.fetches, 3, "{stats:?}");
    assert_eq!(stats.read_requests, 9, "{stats:?}");
    assert_eq!(stats.joined_fetches, 0, "{stats:?}");
    // Across blocks 2 and 3: only block 3 is fetched.
    assert!(timed_read(&f, 3 * block - 4096) >= delay);
    assert_eq!(mount.stats().fetches, 4);
    let file = mount.file_stats("blocks.bin");
    assert_eq!(file.fetches, 4, "{file:?}");
    assert_eq!(file.read_requests, 10, "{file:?}");
    assert_eq!(file.bytes_read, 10 * 64 * 1024, "{file:?}");
    assert_eq!(mount.file_stats(mount.path().join("blocks.bin")), file);
    assert_eq!(mount.file_stats("big.bin"), Default::default());

    // Cold again: block 0 pays its fetch once more.
    mount.forget_fetched();
    assert!(timed_read(&f, 0) >= delay);
    assert_eq!(mount.stats().fetches, 5);
    timed_read(&f, 4096);
    assert_eq!(mount.stats().fetches, 5);

    mount.reset_stats();
    assert_eq!(mount.stats(), safeload_testfs::Stats::default());
    assert_eq!(mount.file_stats("blocks.bin"), Default::default());
    // Counters reset, blocks still fetched.
    timed_read(&f, 0);
    assert_eq!(mount.stats().fetches, 0);
}

#[test]
fn concurrent_readers_of_a_block_share_one_fetch() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    fs::write(tree.path().join("blocks.bin"), bytes(8 * MIB, 3)).unwrap();
    let delay = Duration::from_millis(200);
    let mount = Mount::new(
        tree.path(),
        Options {
            daemon_threads: Some(2),
            first_byte_delay: Some(delay),
            fetch_block: 4 * MIB as u64,
            direct_io: true,
            ..Options::default()
        },
    )
    .unwrap();
    let barrier = Arc::new(Barrier::new(9));
    let threads: Vec<_> = (0..8u64)
        .map(|i| {
            let barrier = Arc::clone(&barrier);
            let path = mount.path().join("blocks.bin");
            thread::spawn(move || {
                let f = File::open(path).unwrap();
                barrier.wait();
                // Eight places in block 1.
                timed_read(&f, 4 * MIB as u64 + i * 256 * 1024);
            })
        })
        .collect();
    let start = Instant::now();
    barrier.wait();
    for t in threads {
        t.join().unwrap();
    }
    let elapsed = start.elapsed();
    let stats = mount.stats();
    assert_eq!(stats.fetches, 1, "{stats:?}");
    assert_eq!(stats.read_requests, 8, "{stats:?}");
    // Readers that arrive during the fetch join it (usually all seven others); one the
    // scheduler holds back past the fetch finds the block fetched. Either way, no second
    // fetch, and all of them are done in about one delay.
    assert!(stats.joined_fetches >= 1, "{stats:?}");
    assert!(elapsed >= delay, "{elapsed:?}");
    assert!(elapsed < delay * 2, "{elapsed:?}");
}

/// A request waiting for the remote leaves its daemon thread free: one thread, four cold
/// blocks at once, and the four fetches overlap.
#[test]
fn fetches_in_flight_hold_no_daemon_thread() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    fs::write(tree.path().join("blocks.bin"), bytes(4 * MIB, 3)).unwrap();
    let delay = Duration::from_millis(250);
    let mount = Mount::new(
        tree.path(),
        Options {
            daemon_threads: Some(1),
            latency: Some(Duration::from_millis(1)),
            first_byte_delay: Some(delay),
            fetch_block: MIB as u64,
            direct_io: true,
            ..Options::default()
        },
    )
    .unwrap();
    let barrier = Arc::new(Barrier::new(5));
    let threads: Vec<_> = (0..4u64)
        .map(|i| {
            let barrier = Arc::clone(&barrier);
            let path = mount.path().join("blocks.bin");
            thread::spawn(move || {
                let f = File::open(path).unwrap();
                barrier.wait();
                timed_read(&f, i * MIB as u64)
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for t in threads {
        assert!(t.join().unwrap() >= delay);
    }
    let elapsed = start.elapsed();
    let stats = mount.stats();
    assert_eq!(stats.fetches, 4, "{stats:?}");
    assert_eq!(stats.max_in_flight, 1, "{stats:?}");
    // Fetches one after another would take 4 delays.
    assert!(elapsed < delay * 2, "{elapsed:?}");
}

/// Through the page cache, the kernel's readahead requests of a cold block share its fetch
/// too, and the bytes come back unchanged.
#[test]
fn first_byte_delay_through_the_page_cache() {
    if skip_without_fuse() {
        return;
    }
    let tree = Tree::new();
    let want = bytes(6 * MIB + 5, 4);
    fs::write(tree.path().join("blocks.bin"), &want).unwrap();
    let mount = Mount::new(
        tree.path(),
        Options {
            daemon_threads: Some(8),
            first_byte_delay: Some(Duration::from_millis(20)),
            fetch_block: 2 * MIB as u64,
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(fs::read(mount.path().join("blocks.bin")).unwrap(), want);
    let stats = mount.stats();
    // Blocks 0, 1, 2 and the 5 bytes of block 3.
    assert_eq!(stats.fetches, 4, "{stats:?}");
    assert_eq!(mount.file_stats("blocks.bin").fetches, 4);
}
