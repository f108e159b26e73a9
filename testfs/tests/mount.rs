//! End-to-end tests: each mounts a temporary tree and reads it back through the kernel.
//!
//! They need FUSE (root, or fusermount3, and /dev/fuse); without it they print
//! `SKIPPED: <reason>` and pass, unless `SAFELOAD_REQUIRE_FUSE=1`.

use std::fs::{self, File};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use safeload_testfs::{Mount, Options, skip_without_fuse};

const MIB: usize = 1024 * 1024;

/// Deterministic, incompressible-looking bytes (xorshift), different per seed.
fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
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
