//! The tests of `write.rs`: reads landing in any order, from many threads, header-only and partial loads, digests that do not match, targets that cannot begin, paused writes and images, two writers of one name.
use super::*;
use std::sync::atomic::AtomicBool;

/// A target in a temporary directory: publishes by renaming to `final`.
struct Folder {
    path: std::path::PathBuf,
    begin_fails: Option<NotCached>,
}

impl Target for Folder {
    fn store(&self) -> CacheStore {
        CacheStore::Directory
    }
    fn begin(&self, len: u64) -> Result<TempFile, NotCached> {
        if let Some(why) = &self.begin_fails {
            return Err(why.clone());
        }
        let dir = Dir::open(&self.path).map_err(|e| NotCached::of_io(&e))?;
        let temp = super::super::layout::temp_name("final", nonce());
        let file = dir.create_new(&temp).map_err(|e| NotCached::of_io(&e))?;
        file.set_len(len).map_err(|e| NotCached::of_io(&e))?;
        Ok(TempFile {
            dir,
            temp,
            file,
            _lock: None,
            moved: AtomicBool::new(false),
            reserved: true,
        })
    }
    fn publish(&self, begun: &TempFile) -> io::Result<bool> {
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
    });
    (dir, target)
}

fn names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

fn sha256_check(bytes: &[u8]) -> Check {
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
        let write = Write::new(target, bytes.len() as u64, sha256_check(&bytes), 1000);
        for (n, &i) in order.iter().enumerate() {
            let (at, piece) = pieces[i];
            write.land(at, piece);
            if n + 1 < order.len() {
                assert!(matches!(
                    write.outcome(),
                    CacheUse::NotCached {
                        why: NotCached::Partial { .. },
                        ..
                    }
                ));
                assert!(!names(dir.path()).contains(&"final".to_owned()));
            }
        }
        assert_eq!(
            write.outcome(),
            CacheUse::Written {
                store: CacheStore::Directory
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
    let write = Write::new(target, bytes.len() as u64, sha256_check(&bytes), 4096);
    write.land(0, &bytes[..8]);
    write.land(8, &bytes[8..4096]);
    assert!(
        names(dir.path()).is_empty(),
        "a header-only open writes nothing"
    );
    write.land(8192, &bytes[8192..16384]);
    assert_eq!(names(dir.path()).len(), 1, "the temporary file");
    assert_eq!(
        write.outcome(),
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
    let write = Write::new(target, bytes.len() as u64, sha256_check(&other), 0);
    write.land(0, &bytes);
    match write.outcome() {
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
    let write = Write::new(target, bytes.len() as u64, Check::Digest(id), 0);
    write.write_image(bytes);
    assert_eq!(write.outcome().as_str(), "written");
    assert_eq!(std::fs::read(dir.path().join("final")).unwrap(), bytes);
}

#[test]
fn a_target_that_cannot_begin_costs_the_cache_only() {
    let bytes = data(10_000);
    let (dir, mut target) = folder();
    target.begin_fails = Some(NotCached::NoSpace);
    let write = Write::new(target, bytes.len() as u64, Check::Whole, 0);
    write.land(0, &bytes);
    assert_eq!(
        write.outcome(),
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
    let write = Write::new(target, bytes.len() as u64, sha256_check(&bytes), 0);
    write.pause();
    write.land(0, &bytes[..1000]);
    assert!(names(dir.path()).is_empty());
    write.write_image(&bytes);
    assert_eq!(write.outcome().as_str(), "written");
    assert_eq!(std::fs::read(dir.path().join("final")).unwrap(), bytes);
    // A second writer of the same name loses the race and leaves nothing.
    let (_, target) = folder();
    let second = Write::new(
        Box::new(Folder {
            path: dir.path().to_path_buf(),
            begin_fails: None,
        }),
        bytes.len() as u64,
        sha256_check(&bytes),
        0,
    );
    drop(target);
    second.land(0, &bytes);
    assert_eq!(
        second.outcome(),
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
    assert_eq!(write.outcome().as_str(), "written");
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
