//! Fuzz target: arbitrary bytes as a mount table (`/proc/self/mountinfo`,
//! `/proc/mounts` or fstab text), parsed with `MountTable::parse_bytes`.
//!
//! Never panics; every entry's mount point is absolute; looking up an entry's
//! own mount point finds an entry at that mount point, with and without the
//! entry's device; each entry's kind is what `classify` says of its fields;
//! the same bytes always parse to the same table.
#![no_main]

use libfuzzer_sys::fuzz_target;
use safeload::mount::{MountTable, classify};

fuzz_target!(|data: &[u8]| {
    let table = MountTable::parse_bytes(data);
    for entry in table.entries() {
        let mount_point = entry.mount_point();
        assert!(mount_point.is_absolute(), "{entry:?}");
        for device in [None, entry.device()] {
            let found = table
                .find(mount_point, device)
                .unwrap_or_else(|| panic!("nothing found at {mount_point:?} ({device:?})"));
            assert_eq!(found.mount_point(), mount_point, "{entry:?}");
        }
        let options = format!("{},{}", entry.options(), entry.super_options());
        assert_eq!(
            entry.kind(),
            classify(entry.fs_type(), entry.source(), &options),
            "{entry:?}"
        );
    }
    assert_eq!(MountTable::parse_bytes(data), table, "parsing is not repeatable");
});
