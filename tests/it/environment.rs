//! `SAFELOAD_DISABLE_MMAP` overrides the auto choice, and an explicit builder
//! call overrides it. Run in a child process of its own (`common::child`): it
//! changes the process environment, which every load of every test reads.

use crate::common::child::{run_alone, run_role};
use crate::common::*;
use safeload::mount::{MountKind, MountTable};
use safeload::report::{Reason, Strategy};
use safeload::{DISABLE_MMAP_ENV, Loader, ReadMode};
use tempfile::tempdir;

fn table(line: &str) -> MountTable {
    MountTable::parse(line)
}

/// Not a test of its own: the entry point of child processes, which return
/// at once unless `ROLE` is set (see `common::child`).
#[test]
fn child() {
    run_role(&[("overrides", overrides_in_child)]);
}

#[test]
fn environment_overrides_auto_and_the_builder_overrides_it() {
    run_alone(module_path!(), "overrides");
}

fn overrides_in_child() {
    let dir = tempdir().unwrap();
    write_single(dir.path(), &every_dtype());
    let fuse = "36 25 0:50 / / ro - fuse hf-mount ro,user_id=0,group_id=0";
    let strategy = |loader: Loader| {
        let sd = loader.mount_table(table(fuse)).load(dir.path()).unwrap();
        let file = &sd.report().files[0];
        (file.strategy, file.reason, file.explain())
    };

    // SAFETY: this process runs one test (`--exact environment::child`), on
    // this thread, so no other thread reads or writes the environment while
    // these calls run.
    unsafe { std::env::set_var(DISABLE_MMAP_ENV, "0") };
    let (s, reason, why) = strategy(Loader::new());
    assert_eq!(s, Strategy::Mmap);
    assert_eq!(
        reason,
        Reason::Environment {
            disable_mmap: false
        }
    );
    assert!(why.contains("SAFELOAD_DISABLE_MMAP=0"), "{why}");
    let (s, reason, why) = strategy(Loader::new().disable_mmap(true));
    assert_eq!(s, Strategy::Buffered, "the builder wins");
    assert_eq!(reason, Reason::Requested { disable_mmap: true });
    assert!(why.contains("disable_mmap(true)"), "{why}");
    // An explicit `ReadMode::Auto` is the same as leaving the mode unset.
    let (s, reason, why) = strategy(Loader::new().read_mode(ReadMode::Auto));
    assert_eq!(s, Strategy::Mmap);
    assert_eq!(
        reason,
        Reason::Environment {
            disable_mmap: false
        }
    );
    assert!(why.contains("SAFELOAD_DISABLE_MMAP=0"), "{why}");

    // SAFETY: as above.
    unsafe { std::env::set_var(DISABLE_MMAP_ENV, "1") };
    let (s, _, _) =
        strategy(Loader::new().mount_table(table("36 25 254:0 / / rw - ext4 /dev/vda rw")));
    assert_eq!(s, Strategy::Buffered);

    // SAFETY: as above.
    unsafe { std::env::remove_var(DISABLE_MMAP_ENV) };
    let (s, reason, why) = strategy(Loader::new());
    assert_eq!(s, Strategy::Buffered);
    assert_eq!(
        reason,
        Reason::Auto {
            kind: MountKind::HfMount
        }
    );
    assert!(why.contains("on hf-mount"), "{why}");

    // SAFELOAD_VERIFY=1 hashes every file where the builder leaves verify
    // unset; verify(false) wins.
    // SAFETY: as above.
    unsafe { std::env::set_var(safeload::VERIFY_ENV, "1") };
    let sd = Loader::new().load(dir.path()).unwrap();
    assert_eq!(
        sd.report().files[0].sha256.as_deref().map(str::len),
        Some(64)
    );
    let sd = Loader::new().verify(false).load(dir.path()).unwrap();
    assert_eq!(sd.report().files[0].sha256, None);
    // SAFETY: as above.
    unsafe { std::env::remove_var(safeload::VERIFY_ENV) };
    let sd = Loader::new().load(dir.path()).unwrap();
    assert_eq!(sd.report().files[0].sha256, None);
}
