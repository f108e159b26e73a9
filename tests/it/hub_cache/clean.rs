//! Housekeeping of the hub cache (`hub_cache_remove`, `hub_cache_prune`) on caches filled by
//! real `hf://` loads from the test server: a revision removed keeps the blobs another one
//! links to, a repository removed, a dry run that removes nothing and counts the same bytes,
//! a prune that spares what a live writer locks and what is fresh, links removed as links,
//! another user's files kept and said, names with `..` refused; and the hub's own client
//! (`huggingface_hub`) still at home in what is left.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, SystemTime};

use safeload::ErrorKind;
use safeload::hub::RemoveMode;
use safeload_testhttp::{DEFAULT_COMMIT, Options, Server};

use super::python::{find_offline, found, has_hub_client};
use super::*;

/// The second revision's commit.
const OTHER_COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
/// The variable that makes "not root" a failure rather than a skip.
const REQUIRE_ROOT: &str = "SAFELOAD_REQUIRE_ROOT";

/// A cache holding two revisions of `org/model`, each filled by a load: `DEFAULT_COMMIT`
/// first, then `OTHER_COMMIT` (where `main` moves), whose third shard differs; the other
/// files' blobs are shared.
struct TwoRevisions {
    hub: Hub,
    other_files: TempDir,
    _other: Server,
    /// The shard that differs.
    changed: String,
}

impl TwoRevisions {
    fn new() -> TwoRevisions {
        let hub = Hub::new(Options::default());
        hub.load("hf://org/model", &[]);
        let other_files = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(hub.files.path()).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), other_files.path().join(entry.file_name())).unwrap();
        }
        let changed = shard_name(2, 3);
        let bumped: Vec<Spec> = naive_load(&[other_files.path().join(&changed)])
            .into_iter()
            .map(|mut s| {
                if matches!(s.dtype, Dtype::F32) {
                    for b in &mut s.data {
                        *b = b.wrapping_add(1);
                    }
                }
                s
            })
            .collect();
        write_file(&other_files.path().join(&changed), &bumped, None);
        assert_ne!(
            hub.bytes(&changed),
            std::fs::read(other_files.path().join(&changed)).unwrap()
        );
        let other = Server::start(
            other_files.path(),
            Options {
                commit: OTHER_COMMIT.to_owned(),
                ..Options::default()
            },
        )
        .unwrap();
        let vars = [
            ("HF_ENDPOINT", other.url()),
            ("HF_HUB_CACHE", hub.cache.path().display().to_string()),
        ];
        run_load("hf://org/model", &vars);
        let revisions = TwoRevisions {
            hub,
            other_files,
            _other: other,
            changed,
        };
        assert!(revisions.snapshot(DEFAULT_COMMIT).is_dir());
        assert!(revisions.snapshot(OTHER_COMMIT).is_dir());
        revisions
    }

    fn snapshot(&self, commit: &str) -> PathBuf {
        self.hub.repo_dir().join("snapshots").join(commit)
    }

    /// The blob of the second revision's file `name`.
    fn other_blob(&self, name: &str) -> PathBuf {
        let bytes = std::fs::read(self.other_files.path().join(name)).unwrap();
        self.hub.repo_dir().join("blobs").join(sha256_hex(&bytes))
    }
}

/// What a housekeeping call in a child printed.
#[derive(Debug, Default)]
struct Cleaned {
    /// (kind, bytes, path) of each name removed or that would be.
    removed: Vec<(String, u64, PathBuf)>,
    /// (code, path) of each name kept.
    kept: Vec<(String, PathBuf)>,
    bytes: u64,
    /// The error's words, where it failed.
    error: Option<String>,
}

impl Cleaned {
    fn removed(&self, path: &Path) -> bool {
        self.removed.iter().any(|(_, _, p)| p == path)
    }

    fn kept_why(&self, path: &Path) -> Option<&str> {
        self.kept
            .iter()
            .find(|(_, p)| p == path)
            .map(|(code, _)| code.as_str())
    }
}

/// Runs `op` (`rm`, `prune`) on `repo` (`""` for none) at `revision` (`""` for none) in a
/// child whose hub cache is `cache`.
fn clean(cache: &Path, op: &str, repo: &str, revision: &str, mode: RemoveMode) -> Cleaned {
    let mode = match mode {
        RemoveMode::DryRun => "dry",
        _ => "remove",
    };
    let spec = format!("{op}\t{repo}\t{revision}\t{mode}");
    let mut cmd = child_command(MODULE, "clean", Path::new(&spec));
    cmd.env("HF_HUB_CACHE", cache)
        .env("HF_HOME", std::env::temp_dir().join("safeload-no-hf-home"));
    let out = cmd.stderr(Stdio::inherit()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains("CHILD-DONE clean"),
        "{spec}: {}\n{stdout}",
        out.status
    );
    let mut cleaned = Cleaned::default();
    for line in stdout.lines() {
        if let Some((_, rest)) = line.split_once("CLEAN-REMOVED ") {
            let parts: Vec<&str> = rest.splitn(3, '\t').collect();
            let bytes = parts[1].parse().unwrap();
            cleaned
                .removed
                .push((parts[0].to_owned(), bytes, PathBuf::from(parts[2])));
        } else if let Some((_, rest)) = line.split_once("CLEAN-KEPT ") {
            let (code, path) = rest.split_once('\t').unwrap();
            cleaned.kept.push((code.to_owned(), PathBuf::from(path)));
        } else if let Some((_, n)) = line.split_once("CLEAN-BYTES ") {
            cleaned.bytes = n.trim().parse().unwrap();
        } else if let Some((_, e)) = line.split_once("CLEAN-ERROR ") {
            cleaned.error = Some(e.to_owned());
        }
    }
    cleaned
}

/// `None` for an empty name.
fn some(text: &str) -> Option<&str> {
    (!text.is_empty()).then_some(text)
}

/// The child's side of [`clean`]: the call, then a line per name removed and kept.
pub(super) fn act() {
    let spec = std::env::var(PATH).unwrap();
    let parts: Vec<&str> = spec.split('\t').collect();
    let [op, repo, revision, mode] = parts[..] else {
        panic!("{spec}")
    };
    let mode = match mode {
        "dry" => RemoveMode::DryRun,
        _ => RemoveMode::Remove,
    };
    let result = match op {
        "rm" => safeload::hub::hub_cache_remove(repo, some(revision), mode),
        _ => safeload::hub::hub_cache_prune(some(repo), mode),
    };
    match result {
        Ok(done) => {
            assert_eq!(done.mode, mode);
            for e in &done.removed {
                let kind = e.kind.as_str();
                println!("CLEAN-REMOVED {kind}\t{}\t{}", e.bytes, e.path.display());
            }
            for k in &done.kept {
                println!("CLEAN-KEPT {}\t{}", k.why.as_str(), k.path.display());
            }
            println!("CLEAN-BYTES {}", done.bytes);
            // The words say it too.
            let text = done.to_string();
            assert!(text.starts_with("hub cache: "), "{text}");
        }
        Err(e) => println!(
            "CLEAN-ERROR {e} [not_found={} bad_address={}]",
            e.is_not_found(),
            matches!(e.kind(), ErrorKind::BadAddress { .. })
        ),
    }
}

fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

#[test]
fn removing_a_revision_keeps_the_blobs_another_revision_links_to_and_removes_the_rest() {
    let two = TwoRevisions::new();
    let hub = &two.hub;
    let cache = hub.cache.path();
    let old_blob = hub.blob(&two.changed);
    let shared: Vec<PathBuf> = [shard_name(0, 3), shard_name(1, 3)]
        .iter()
        .map(|n| hub.blob(n))
        .collect();
    let done = clean(cache, "rm", "org/model", DEFAULT_COMMIT, RemoveMode::Remove);
    assert!(done.error.is_none(), "{done:#?}");
    assert!(done.kept.is_empty(), "{done:#?}");
    // The snapshot, its marker and the blob only it linked to: gone.
    assert!(!exists(&two.snapshot(DEFAULT_COMMIT)));
    assert!(!exists(
        &hub.repo_dir().join(".no_exist").join(DEFAULT_COMMIT)
    ));
    assert!(!exists(&old_blob));
    assert!(done.removed(&old_blob) && done.removed(&two.snapshot(DEFAULT_COMMIT)));
    assert_eq!(
        done.bytes,
        hub.bytes(&two.changed).len() as u64,
        "{done:#?}"
    );
    // The other revision whole, its ref, the blobs it shares.
    for blob in &shared {
        assert!(blob.is_file(), "{}", blob.display());
        assert!(!done.removed(blob));
    }
    assert!(two.other_blob(&two.changed).is_file());
    assert!(two.snapshot(OTHER_COMMIT).join(&two.changed).is_file());
    let main = std::fs::read_to_string(hub.repo_dir().join("refs/main")).unwrap();
    assert_eq!(main.trim(), OTHER_COMMIT);
    assert_eq!(snapshot_commits(cache), vec![OTHER_COMMIT.to_owned()]);
    // By its ref: `main` goes with it, and with no snapshot left, every blob.
    let done = clean(cache, "rm", "org/model", "main", RemoveMode::Remove);
    assert!(done.error.is_none() && done.kept.is_empty(), "{done:#?}");
    assert!(!exists(&hub.repo_dir().join("refs/main")));
    assert!(
        done.removed.iter().any(|(kind, _, _)| kind == "ref"),
        "{done:#?}"
    );
    assert!(!exists(&two.snapshot(OTHER_COMMIT)));
    let blobs = tree(&hub.repo_dir().join("blobs"));
    assert!(blobs.is_empty(), "{blobs:?}");
    // Again: there is no such revision any more.
    let again = clean(cache, "rm", "org/model", OTHER_COMMIT, RemoveMode::Remove);
    let e = again.error.unwrap_or_default();
    assert!(
        e.contains("not_found=true") && e.contains(OTHER_COMMIT),
        "{e}"
    );
}

/// The snapshots of `org/model` in `cache`.
fn snapshot_commits(cache: &Path) -> Vec<String> {
    let mut commits: Vec<String> = std::fs::read_dir(cache.join("models--org--model/snapshots"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    commits.sort();
    commits
}

#[test]
fn a_dry_run_removes_nothing_and_counts_what_the_removal_then_removes() {
    let two = TwoRevisions::new();
    let cache = two.hub.cache.path();
    for (op, repo, revision) in [
        ("rm", "org/model", DEFAULT_COMMIT),
        ("prune", "", ""),
        ("rm", "org/model", ""),
    ] {
        let before = tree(cache);
        let planned = clean(cache, op, repo, revision, RemoveMode::DryRun);
        assert!(planned.error.is_none(), "{planned:#?}");
        assert_eq!(
            tree(cache),
            before,
            "{op} {revision}: a dry run removed something"
        );
        let done = clean(cache, op, repo, revision, RemoveMode::Remove);
        assert_eq!(planned.removed, done.removed, "{op} {revision}");
        assert_eq!(planned.bytes, done.bytes, "{op} {revision}");
        for (_, _, path) in &done.removed {
            assert!(!exists(path), "{}", path.display());
        }
    }
    // The last was the whole repository.
    assert!(!exists(&two.hub.repo_dir()));
}

#[test]
fn removing_a_repository_removes_its_folder_and_nothing_beside_it() {
    let hub = Hub::new(Options::default());
    hub.load("hf://org/model", &[]);
    let cache = hub.cache.path();
    let beside = cache.join("models--org--other/blobs");
    std::fs::create_dir_all(&beside).unwrap();
    std::fs::write(beside.join("ab".repeat(32)), b"another repository's").unwrap();
    let blob_bytes: u64 = hub.names().iter().map(|n| hub.bytes(n).len() as u64).sum();
    let done = clean(cache, "rm", "org/model", "", RemoveMode::Remove);
    assert!(done.error.is_none() && done.kept.is_empty(), "{done:#?}");
    assert!(!exists(&hub.repo_dir()));
    assert!(done.removed(&hub.repo_dir()));
    // The blobs' bytes and the ref's 40 are what it held.
    let refs = DEFAULT_COMMIT.len() as u64;
    assert_eq!(done.bytes, blob_bytes + refs, "{done:#?}");
    assert!(beside.join("ab".repeat(32)).is_file());
    // The lock files stay for whoever may wait on one.
    assert!(cache.join(".locks/models--org--model").is_dir());
    let missing = clean(cache, "rm", "org/model", "", RemoveMode::Remove);
    let e = missing.error.unwrap_or_default();
    assert!(
        e.contains("not_found=true") && e.contains("models--org--model"),
        "{e}"
    );
}

/// Makes `path` a file of `len` bytes last written `age` ago.
fn file_aged(path: &Path, len: usize, age: Duration) {
    std::fs::write(path, vec![7u8; len]).unwrap();
    let file = File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::now() - age).unwrap();
}

#[test]
fn prune_removes_stale_temporary_files_whose_lock_is_free_and_blobs_no_snapshot_links_to() {
    let hub = Hub::new(Options::default());
    hub.load("hf://org/model", &[]);
    let cache = hub.cache.path();
    let blobs = hub.repo_dir().join("blobs");
    let locks = cache.join(".locks/models--org--model");
    let hour = Duration::from_secs(7200);
    let name = |c: &str| c.repeat(64);
    std::fs::create_dir_all(&locks).unwrap();
    // Stale, its lock file there and free: removed.
    let free = blobs.join(format!("{}.00000000000000a1.incomplete", name("a")));
    file_aged(&free, 1000, hour);
    File::create(locks.join(format!("{}.lock", name("a")))).unwrap();
    // Stale, its lock held (by this test, as a live writer would): kept.
    let held = blobs.join(format!("{}.00000000000000b2.incomplete", name("b")));
    file_aged(&held, 2000, hour);
    let lock = File::create(locks.join(format!("{}.lock", name("b")))).unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
    // Fresh: kept, a download may be under way.
    let fresh = blobs.join(format!("{}.00000000000000c3.incomplete", name("c")));
    file_aged(&fresh, 3000, Duration::ZERO);
    // A blob no snapshot links to: removed.
    let orphan = blobs.join(name("d"));
    file_aged(&orphan, 4000, Duration::ZERO);
    let done = clean(cache, "prune", "org/model", "", RemoveMode::Remove);
    assert!(done.error.is_none(), "{done:#?}");
    assert!(!exists(&free) && done.removed(&free), "{done:#?}");
    assert!(!exists(&orphan) && done.removed(&orphan), "{done:#?}");
    assert_eq!(done.bytes, 1000 + 4000, "{done:#?}");
    assert!(held.is_file());
    assert_eq!(done.kept_why(&held), Some("locked"), "{done:#?}");
    assert!(fresh.is_file());
    assert_eq!(done.kept_why(&fresh), Some("recent"), "{done:#?}");
    // Every linked blob stays, and the load still reads them all from the cache.
    for name in hub.names() {
        assert_cached(&hub, &name);
    }
    // The lock released: the stale file goes.
    drop(lock);
    let done = clean(cache, "prune", "", "", RemoveMode::Remove);
    assert!(done.removed(&held), "{done:#?}");
    assert!(!exists(&held));
    let warm = hub.load("hf://org/model", &[("HF_HUB_OFFLINE", "1".to_owned())]);
    assert!(warm.every("hit"), "{warm:#?}");
}

#[test]
fn a_link_planted_in_a_snapshot_is_removed_as_a_link_and_its_target_survives() {
    let hub = Hub::new(Options::default());
    hub.load("hf://org/model", &[]);
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("precious.txt");
    std::fs::write(&target, b"not the cache's").unwrap();
    let folder = outside.path().join("folder");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("inside.txt"), b"nor this").unwrap();
    let snapshot = hub.snapshot();
    let file_link = snapshot.join("evil.safetensors");
    let dir_link = snapshot.join("evil-dir");
    std::os::unix::fs::symlink(&target, &file_link).unwrap();
    std::os::unix::fs::symlink(&folder, &dir_link).unwrap();
    let done = clean(
        hub.cache.path(),
        "rm",
        "org/model",
        "main",
        RemoveMode::Remove,
    );
    assert!(done.error.is_none() && done.kept.is_empty(), "{done:#?}");
    for link in [&file_link, &dir_link] {
        assert!(!exists(link), "{}", link.display());
        let entry = done.removed.iter().find(|(_, _, p)| p == link).unwrap();
        assert_eq!((entry.0.as_str(), entry.1), ("link", 0), "{entry:?}");
    }
    assert_eq!(std::fs::read(&target).unwrap(), b"not the cache's");
    assert_eq!(
        std::fs::read(folder.join("inside.txt")).unwrap(),
        b"nor this"
    );
    assert!(!exists(&snapshot));
}

/// Whether this process runs as root; where not, a `SKIPPED:` line (a panic under
/// `SAFELOAD_REQUIRE_ROOT=1`).
pub(super) fn is_root() -> bool {
    let root = rustix::process::geteuid().is_root();
    if !root {
        assert!(
            std::env::var_os(REQUIRE_ROOT).is_none_or(|v| v != "1"),
            "{REQUIRE_ROOT}=1 but not root"
        );
        eprintln!("SKIPPED: not root: files of another uid cannot be made");
    }
    root
}

#[test]
fn a_file_another_user_owns_is_kept_and_said_to_be() {
    if !is_root() {
        return;
    }
    let hub = Hub::new(Options::default());
    hub.load("hf://org/model", &[]);
    let cache = hub.cache.path();
    let nobody = 65534;
    // An unlinked blob and a stale temporary file of another user: prune keeps both.
    let theirs = hub.repo_dir().join("blobs").join("e".repeat(64));
    file_aged(&theirs, 100, Duration::ZERO);
    let temp = hub
        .repo_dir()
        .join("blobs")
        .join(format!("{}.00000000000000f4.incomplete", "f".repeat(64)));
    file_aged(&temp, 100, Duration::from_secs(7200));
    for path in [&theirs, &temp] {
        std::os::unix::fs::lchown(path, Some(nobody), Some(nobody)).unwrap();
    }
    let done = clean(cache, "prune", "org/model", "", RemoveMode::Remove);
    assert!(theirs.is_file() && temp.is_file());
    assert_eq!(done.kept_why(&theirs), Some("other_owner"), "{done:#?}");
    assert_eq!(done.kept_why(&temp), Some("other_owner"), "{done:#?}");
    assert_eq!(std::fs::symlink_metadata(&theirs).unwrap().uid(), nobody);
    // Removing the repository: their file stays, and the folders holding it.
    let link = hub.snapshot().join(shard_name(0, 3));
    std::os::unix::fs::lchown(&link, Some(nobody), Some(nobody)).unwrap();
    let done = clean(cache, "rm", "org/model", "", RemoveMode::Remove);
    assert!(done.error.is_none(), "{done:#?}");
    assert_eq!(done.kept_why(&link), Some("other_owner"), "{done:#?}");
    assert_eq!(done.kept_why(&theirs), Some("other_owner"), "{done:#?}");
    assert_eq!(
        done.kept_why(&hub.repo_dir()),
        Some("holds_kept"),
        "{done:#?}"
    );
    assert!(exists(&link) && theirs.is_file());
    // What was this user's went.
    assert!(!exists(&hub.blob(&shard_name(1, 3))));
    assert!(!exists(&hub.repo_dir().join("refs/main")));
}

#[test]
fn names_with_dots_or_slashes_are_refused_before_anything_is_touched() {
    let hub = Hub::new(Options::default());
    hub.load("hf://org/model", &[]);
    let cache = hub.cache.path();
    let before = tree(cache);
    for (repo, revision) in [
        ("..", ""),
        ("../..", ""),
        ("org/..", ""),
        ("org/model/../../x", ""),
        ("org/../../etc", ""),
        ("/etc/passwd", ""),
        ("org--model/x", ""),
        ("org/model", "../../../etc"),
        ("org/model", "refs/../../x"),
        ("org/model", "/main"),
    ] {
        let done = clean(cache, "rm", repo, revision, RemoveMode::Remove);
        let e = done
            .error
            .unwrap_or_else(|| panic!("{repo} @ {revision}: accepted"));
        assert!(e.contains("bad_address=true"), "{e}");
        assert!(e.starts_with(&format!("hf://{repo}")), "{e}");
    }
    let pruned = clean(cache, "prune", "org/..", "", RemoveMode::Remove);
    assert!(pruned.error.is_some(), "{pruned:#?}");
    assert_eq!(tree(cache), before);
    // In this process too, with the kind to match on.
    let e = safeload::hub::hub_cache_remove("org/../x", None, RemoveMode::DryRun).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::BadAddress { .. }), "{e}");
    assert_eq!(e.path(), Some(Path::new("hf://org/../x")));
}

#[test]
fn after_a_removal_the_hubs_client_scans_no_warning_and_finds_the_kept_revision() {
    if !has_hub_client() {
        return;
    }
    let two = TwoRevisions::new();
    let hub = &two.hub;
    let done = clean(
        hub.cache.path(),
        "rm",
        "org/model",
        DEFAULT_COMMIT,
        RemoveMode::Remove,
    );
    assert!(done.error.is_none() && done.kept.is_empty(), "{done:#?}");
    let (names, out) = find_offline(hub);
    assert!(!out.contains("WARNING"), "{out}");
    assert!(!out.contains(DEFAULT_COMMIT), "{out}");
    for name in &names {
        let (line, fields) = found(&out, name);
        let want = std::fs::read(two.other_files.path().join(name)).unwrap();
        assert_eq!(fields[3], sha256_hex(&want), "{line}");
        assert!(
            out.contains(&format!("SCANNED org/model {OTHER_COMMIT} main {name} ")),
            "{out}"
        );
    }
}
