//! The tests of `write.rs`: reads landing in any order, from many threads, header-only and partial loads, digests that do not match, targets that cannot begin, paused writes and images, two writers of one name.
use super::*;
use crate::cache::layout::Named;
use crate::os::Dir;
use crate::source::CacheWrite;
use sha2::{Digest, Sha256};
use std::time::Duration;

/// A target in a temporary directory: publishes by renaming to `final`; `resumable`, it
/// takes `final.lock` and writes through the partial file a later write resumes.
pub(super) struct Folder {
    pub(super) path: std::path::PathBuf,
    pub(super) begin_fails: Option<NotCached>,
    pub(super) resumable: bool,
    /// Publishing waits for a message here (a check held half way).
    pub(super) gate: Option<Mutex<std::sync::mpsc::Receiver<()>>>,
}

impl Target for Folder {
    fn store(&self) -> CacheStore {
        CacheStore::Directory
    }
    fn shown(&self) -> std::path::PathBuf {
        self.path.join("final")
    }
    fn begin(&self, len: u64) -> Result<TempFile, NotCached> {
        if let Some(why) = &self.begin_fails {
            return Err(why.clone());
        }
        let dir = Dir::open(&self.path).map_err(|e| NotCached::of_io(&e))?;
        // Its lock `final.lock` beside it.
        let locks = self.resumable.then(|| dir.sub(".", false).unwrap());
        TempFile::make(dir, "final", len, locks)
    }
    fn published(&self, len: u64) -> Option<File> {
        let file = Dir::open(&self.path).ok()?.open_nofollow("final").ok()?;
        (file.metadata().ok()?.len() == len).then_some(file)
    }
    fn activity(&self) -> partial::Activity {
        partial::activity(&Dir::open(&self.path).unwrap(), "final")
    }
    fn publish(&self, begun: &TempFile) -> io::Result<bool> {
        if let Some(gate) = &self.gate {
            let _ = lock(gate).recv();
        }
        let done = begun.dir.rename_noreplace(&begun.temp, "final")?;
        begun.moved.store(done, Ordering::Relaxed);
        Ok(done)
    }
}

fn folder() -> (tempfile::TempDir, Box<Folder>) {
    let dir = tempfile::tempdir().unwrap();
    let target = Box::new(Folder {
        path: dir.path().to_path_buf(),
        begin_fails: None,
        resumable: false,
        gate: None,
    });
    (dir, target)
}

#[test]
fn with_a_guard_the_last_read_returns_while_the_check_goes_on_and_settle_waits_for_it() {
    let bytes = data(5 << 20);
    let (dir, mut target) = folder();
    let (open, gate) = std::sync::mpsc::channel();
    target.gate = Some(Mutex::new(gate));
    let write = Write::new(
        target,
        bytes.len() as u64,
        sha256_check(&bytes),
        0,
        crate::cancel::Cancel::NONE,
    );
    // The tensors' storage keeps the guard: the check goes on after the load.
    let guard = write.settle_on_drop();
    write.land(0, &bytes);
    // The landing thread did not wait: the check is held before publishing.
    assert_eq!(
        write.outcome(),
        CacheUse::Checking {
            store: CacheStore::Directory,
            resumed: 0,
            refetched: 0,
        }
    );
    assert!(!names(dir.path()).contains(&"final".to_owned()));
    let waiter = {
        let write = Arc::clone(&write);
        std::thread::spawn(move || write.settled())
    };
    std::thread::sleep(Duration::from_millis(50));
    assert!(!waiter.is_finished(), "settle waits for the publish");
    open.send(()).unwrap();
    assert_eq!(waiter.join().unwrap().as_str(), "written");
    assert_eq!(std::fs::read(dir.path().join("final")).unwrap(), bytes);
    drop(guard);
    // Dropping the guard waits the same way.
    let (dir, target) = folder();
    let write = Write::new(
        target,
        bytes.len() as u64,
        sha256_check(&bytes),
        0,
        crate::cancel::Cancel::NONE,
    );
    let guard = write.settle_on_drop();
    write.land(0, &bytes);
    drop(guard);
    assert_eq!(write.outcome().as_str(), "written");
    assert_eq!(names(dir.path()), ["final"]);
    // Without one, the read that completes the file checks and publishes it.
    let (dir, target) = folder();
    let write = Write::new(
        target,
        bytes.len() as u64,
        sha256_check(&bytes),
        0,
        crate::cancel::Cancel::NONE,
    );
    write.land(0, &bytes);
    assert_eq!(write.outcome().as_str(), "written");
    assert_eq!(names(dir.path()), ["final"]);
}

#[test]
fn the_checks_thread_waits_for_the_process_fills_and_a_waiter_does_not() {
    let bytes = data(3 << 20);
    // Another file of the process being filled as a load's destination.
    let fill = Filling::start();
    let (_dir, target) = folder();
    let write = Write::new(
        target,
        bytes.len() as u64,
        sha256_check(&bytes),
        0,
        crate::cancel::Cancel::NONE,
    );
    let guard = write.settle_on_drop();
    write.land(0, &bytes);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        write.outcome().as_str(),
        "checking",
        "the check waits for the fill"
    );
    // Dropping the guard checks and publishes here, the fill still on.
    drop(guard);
    assert_eq!(write.outcome().as_str(), "written");
    // Once the fills end, the check's thread publishes on its own.
    let (dir, target) = folder();
    let write = Write::new(
        target,
        bytes.len() as u64,
        sha256_check(&bytes),
        0,
        crate::cancel::Cancel::NONE,
    );
    let guard = write.settle_on_drop();
    write.land(0, &bytes);
    drop(fill);
    let start = std::time::Instant::now();
    while write.outcome().as_str() != "written" && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(write.outcome().as_str(), "written");
    assert_eq!(names(dir.path()), ["final"]);
    drop(guard);
}

pub(super) fn names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

pub(super) fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

pub(super) fn sha256_check(bytes: &[u8]) -> Check {
    Check::Digest(Named::Sha256(Sha256::digest(bytes).into()))
}

#[test]
fn reads_in_any_order_publish_the_file_once_complete() {
    let bytes = data(3 << 20);
    let pieces: Vec<(u64, &[u8])> = bytes
        .chunks(300_001)
        .enumerate()
        .map(|(i, c)| ((i * 300_001) as u64, c))
        .collect();
    for order in [
        (0..pieces.len()).collect::<Vec<_>>(),
        (0..pieces.len()).rev().collect(),
        (0..pieces.len()).map(|i| i * 7 % pieces.len()).collect(),
    ] {
        let (dir, target) = folder();
        let write = Write::new(
            target,
            bytes.len() as u64,
            sha256_check(&bytes),
            1000,
            crate::cancel::Cancel::NONE,
        );
        for (n, &i) in order.iter().enumerate() {
            let (at, piece) = pieces[i];
            write.land(at, piece);
            if n + 1 < order.len() {
                assert!(matches!(
                    write.settled(),
                    CacheUse::NotCached {
                        why: NotCached::Partial { .. },
                        ..
                    }
                ));
                assert!(!names(dir.path()).contains(&"final".to_owned()));
            }
        }
        assert_eq!(
            write.settled(),
            CacheUse::Written {
                store: CacheStore::Directory,
                resumed: 0,
                refetched: 0,
            }
        );
        assert_eq!(names(dir.path()), ["final"]);
        assert_eq!(std::fs::read(dir.path().join("final")).unwrap(), bytes);
    }
}

#[test]
fn a_header_read_alone_makes_no_file_and_a_partial_load_leaves_none() {
    let bytes = data(1 << 20);
    let (dir, target) = folder();
    let write = Write::new(
        target,
        bytes.len() as u64,
        sha256_check(&bytes),
        4096,
        crate::cancel::Cancel::NONE,
    );
    write.land(0, &bytes[..8]);
    write.land(8, &bytes[8..4096]);
    assert!(
        names(dir.path()).is_empty(),
        "a header-only open writes nothing"
    );
    write.land(8192, &bytes[8192..16384]);
    assert_eq!(names(dir.path()).len(), 1, "the temporary file");
    assert_eq!(
        write.settled(),
        CacheUse::NotCached {
            store: CacheStore::Directory,
            why: NotCached::Partial {
                read: 4096 + 8192,
                len: 1 << 20
            }
        }
    );
    drop(write);
    assert!(names(dir.path()).is_empty(), "nothing partial is left");
}

#[test]
fn bytes_that_do_not_hash_to_the_name_are_not_published() {
    let bytes = data(100_000);
    let (dir, target) = folder();
    let mut other = bytes.clone();
    other[5] ^= 1;
    let write = Write::new(
        target,
        bytes.len() as u64,
        sha256_check(&other),
        0,
        crate::cancel::Cancel::NONE,
    );
    write.land(0, &bytes);
    match write.settled() {
        CacheUse::NotCached {
            why: NotCached::Mismatch { expected, actual },
            ..
        } => {
            assert_ne!(expected, actual);
        }
        other => panic!("{other:?}"),
    }
    assert!(names(dir.path()).is_empty());
}

#[test]
fn git_blob_ids_check_small_files() {
    // `git hash-object` of "hello\n".
    let bytes = b"hello\n";
    let id =
        super::super::layout::named_digest("ce013625030ba8dba906f756967f9e9ca394464a").unwrap();
    let (dir, target) = folder();
    let write = Write::new(
        target,
        bytes.len() as u64,
        Check::Digest(id),
        0,
        crate::cancel::Cancel::NONE,
    );
    write.write_image(bytes);
    assert_eq!(write.settled().as_str(), "written");
    assert_eq!(std::fs::read(dir.path().join("final")).unwrap(), bytes);
}

#[test]
fn a_target_that_cannot_begin_costs_the_cache_only() {
    let bytes = data(10_000);
    let (dir, mut target) = folder();
    target.begin_fails = Some(NotCached::NoSpace);
    let write = Write::new(
        target,
        bytes.len() as u64,
        Check::Whole,
        0,
        crate::cancel::Cancel::NONE,
    );
    write.land(0, &bytes);
    assert_eq!(
        write.settled(),
        CacheUse::NotCached {
            store: CacheStore::Directory,
            why: NotCached::NoSpace
        }
    );
    assert!(names(dir.path()).is_empty());
}

#[test]
fn paused_reads_are_not_written_and_an_image_is() {
    let bytes = data(200_000);
    let (dir, target) = folder();
    let write = Write::new(
        target,
        bytes.len() as u64,
        sha256_check(&bytes),
        0,
        crate::cancel::Cancel::NONE,
    );
    write.pause();
    write.land(0, &bytes[..1000]);
    assert!(names(dir.path()).is_empty());
    write.write_image(&bytes);
    assert_eq!(write.settled().as_str(), "written");
    assert_eq!(std::fs::read(dir.path().join("final")).unwrap(), bytes);
    // A second writer of the same name finds it published and reads it from there.
    let (_, target) = folder();
    let second = Write::new(
        Box::new(Folder {
            path: dir.path().to_path_buf(),
            begin_fails: None,
            resumable: false,
            gate: None,
        }),
        bytes.len() as u64,
        sha256_check(&bytes),
        0,
        crate::cancel::Cancel::NONE,
    );
    drop(target);
    let local = second.local(0..bytes.len() as u64).unwrap();
    assert_eq!(local.ranges, vec![0..bytes.len() as u64]);
    second.land(0, &bytes);
    assert_eq!(
        second.settled(),
        CacheUse::NotCached {
            store: CacheStore::Directory,
            why: NotCached::PublishedElsewhere
        }
    );
    assert_eq!(names(dir.path()), ["final"]);
}

#[test]
fn many_threads_landing_at_once_publish_once() {
    let bytes = Arc::new(data(8 << 20));
    let (dir, target) = folder();
    let write = Arc::new(Write::new(
        target,
        bytes.len() as u64,
        sha256_check(&bytes),
        0,
        crate::cancel::Cancel::NONE,
    ));
    let piece = 65_537usize;
    let count = bytes.len().div_ceil(piece);
    let next = Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        for _ in 0..8 {
            let (write, bytes, next) = (Arc::clone(&write), Arc::clone(&bytes), Arc::clone(&next));
            s.spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    if i >= count {
                        break;
                    }
                    // Out of order: from both ends.
                    let i = if i % 2 == 0 { i / 2 } else { count - 1 - i / 2 };
                    let start = i * piece;
                    let end = (start + piece).min(bytes.len());
                    write.land(start as u64, &bytes[start..end]);
                }
            });
        }
    });
    assert_eq!(write.settled().as_str(), "written");
    assert_eq!(std::fs::read(dir.path().join("final")).unwrap(), *bytes);
}

#[test]
fn ranges_merge() {
    let mut c = Vec::new();
    cover(&mut c, 10..20);
    cover(&mut c, 30..40);
    cover(&mut c, 0..5);
    assert_eq!(c, [0..5, 10..20, 30..40]);
    cover(&mut c, 5..10);
    assert_eq!(c, [0..20, 30..40]);
    cover(&mut c, 15..35);
    assert_eq!(c, vec![0..40]);
    cover(&mut c, 40..41);
    assert_eq!(c.first(), Some(&(0..41)));
    assert_eq!(c.len(), 1);
}
