//! The decisions about one file of a load: mapped or read, with direct I/O or not, converted or not; each with its reason as data.

use safetensors::Dtype;

use super::guard::MemoryVerdict;
use super::reason::{DirectIo, Fallback, Reason, auto_rule};
use super::{Origin, ReadMode, Strategy};
use crate::mount::{Mount, MountKind};

/// How one file is read, and why: the rule, what changed the choice, direct I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileDecision {
    pub strategy: Strategy,
    pub origin: Origin,
    pub mode: ReadMode,
    pub mount: Option<Mount>,
    pub fallback: Option<Fallback>,
    pub direct: DirectIo,
    /// A remote object: read buffered whatever the mode, never mapped.
    pub remote: bool,
}

impl FileDecision {
    /// Whether the memory guard may map this file: only where the auto policy chose to read it.
    pub(crate) fn switchable(&self) -> bool {
        self.mode == ReadMode::Auto
            && self.strategy == Strategy::Buffered
            && self.fallback.is_none()
            && !self.remote
    }

    /// The map was refused: read the file instead.
    pub(crate) fn mmap_refused(&mut self, error: &std::io::Error) {
        self.strategy = Strategy::Buffered;
        self.fallback = Some(Fallback::MmapRefused {
            error: error.to_string(),
        });
    }

    /// The memory guard maps the file instead of reading it.
    pub(crate) fn memory_guard(&mut self, verdict: &MemoryVerdict, available: u64) {
        self.strategy = Strategy::Mmap;
        self.fallback = Some(Fallback::MemoryGuard {
            needed: verdict.needed,
            available,
            kept: verdict.kept,
            files: verdict.files,
        });
        self.direct = DirectIo::Off;
    }

    /// Whether direct I/O was used, or why not.
    pub(crate) fn set_direct(&mut self, direct: DirectIo) {
        self.direct = direct;
    }

    /// The rule that chose the strategy.
    pub(crate) fn reason(&self) -> Reason {
        let disable_mmap = self.mode == ReadMode::Buffered;
        match self.origin {
            _ if self.remote => Reason::Remote,
            _ if self.mode == ReadMode::Auto => Reason::Auto {
                kind: self.mount.as_ref().map_or(MountKind::Unknown, |m| m.kind),
            },
            Origin::Environment => Reason::Environment { disable_mmap },
            _ => Reason::Requested { disable_mmap },
        }
    }
}

/// What the auto policy does with a file on a mount: how it reads it and why, whether with
/// direct I/O, and whether it prefetches before mapping.
///
/// ```
/// use safeload::mount::{MountTable, lookup_in};
///
/// let table = MountTable::parse("hf-mount / fuse rw,user_id=0,group_id=0 0 0\n");
/// let mount = lookup_in(&table, &std::env::temp_dir())?;
/// let auto = mount.auto_policy();
/// if cfg!(target_os = "linux") {
///     assert_eq!(auto.strategy, safeload::report::Strategy::Buffered);
///     assert!(auto.reason.contains("mmap page faults stall"));
///     assert!(auto.direct_io);
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AutoPolicy {
    /// Mapped or read.
    pub strategy: Strategy,
    /// Why, in words (what a load's report says).
    pub reason: String,
    /// Whether buffered reads use `O_DIRECT` for a file not mostly in the page cache.
    pub direct_io: bool,
    /// Prefetch streams before mapping a cold file; `None`: no prefetch.
    pub prefetch_streams: Option<usize>,
}

impl Mount {
    /// What the auto policy does with a file on this mount, with every option unset.
    #[doc(hidden)]
    pub fn auto_policy(&self) -> AutoPolicy {
        let decision = choose(ReadMode::Auto, Origin::Default, Some(self));
        let mapped = decision.strategy == Strategy::Mmap;
        AutoPolicy {
            strategy: decision.strategy,
            reason: decision.to_string(),
            direct_io: !mapped && wants_direct_io(None, Some(self.kind), true, || false),
            prefetch_streams: mapped
                .then(|| super::auto_prefetch_streams(self.kind))
                .flatten(),
        }
    }
}

/// Decides how to read one file, from the effective mode and its mount.
pub(crate) fn choose(mode: ReadMode, origin: Origin, mount: Option<&Mount>) -> FileDecision {
    let strategy = match mode {
        ReadMode::Mmap => Strategy::Mmap,
        ReadMode::Buffered => Strategy::Buffered,
        ReadMode::Auto => auto_rule(mount.map_or(MountKind::Unknown, |m| m.kind)).0,
    };
    FileDecision {
        strategy,
        origin,
        mode,
        mount: mount.cloned(),
        fallback: None,
        direct: DirectIo::Off,
        remote: false,
    }
}

/// Decides how to read a remote object: buffered whatever the mode (no file to map).
pub(crate) fn choose_remote(mode: ReadMode, origin: Origin) -> FileDecision {
    FileDecision {
        strategy: Strategy::Buffered,
        remote: true,
        ..choose(mode, origin, None)
    }
}

/// Whether a buffered file's reads bypass the page cache: the caller's choice, else the
/// filesystem's default for a file not mostly cached. Direct reads need a block-laid `image`.
///
/// NOTE: on FUSE, cached reads reach the daemon as requests of at most 128 KiB, direct ones
/// as 1 MiB; a cold local disk was faster direct too (BENCHMARKS.md, "policy/file.rs:
/// wants_direct_io"). Kernel network filesystems, not measured, keep plain reads.
pub(crate) fn wants_direct_io(
    caller: Option<bool>,
    kind: Option<MountKind>,
    image: bool,
    mostly_cached: impl FnOnce() -> bool,
) -> bool {
    let by_default = || {
        matches!(
            kind,
            Some(MountKind::HfMount | MountKind::Fuse | MountKind::Local)
        ) && !mostly_cached()
    };
    image && caller.unwrap_or_else(by_default)
}

/// Whether a converting load (`Loader::dtype(to)`) converts a tensor of `from`, and if so the
/// size of one converted element: only the floating types `convert` handles; the others stay
/// as they are, so that a converting load never fails on them.
pub fn converts_to(from: Dtype, to: Dtype) -> Option<usize> {
    let floating = matches!(
        from,
        Dtype::F64 | Dtype::F32 | Dtype::F16 | Dtype::BF16 | Dtype::F8_E4M3 | Dtype::F8_E5M2
    );
    (floating && from != to && crate::convert::is_supported(from, to)).then(|| to.bitsize() / 8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mount::MountTable;
    use crate::policy::memory_guard;

    /// A mount of `kind` as a lookup would give it, from a one-line table.
    fn mount(line: &str) -> Mount {
        let table = MountTable::parse(line);
        let entry = table.entries().first().cloned();
        let entry = entry.unwrap_or_else(|| panic!("unparsable fixture {line}"));
        Mount {
            source: entry.source().to_string(),
            mount_point: entry.mount_point().to_path_buf(),
            fs_type: entry.fs_type().to_string(),
            kind: entry.kind(),
            detected_by: crate::mount::Detection::Device,
        }
    }

    const HF: &str = "hf-mount /mnt/hub fuse rw,user_id=0,group_id=0 0 0\n";
    const NFS_LOOPBACK: &str = "127.0.0.1:/ /mnt/hub nfs4 rw,addr=127.0.0.1 0 0\n";
    const S3FS: &str = "s3fs /mnt/s3 fuse.s3fs rw 0 0\n";
    const NFS: &str = "server:/export /mnt/nfs nfs4 rw,addr=10.0.0.5 0 0\n";
    const EXT4: &str = "/dev/vda / ext4 rw 0 0\n";
    const AUTOFS: &str = "systemd-1 /net autofs rw 0 0\n";

    #[test]
    fn auto_strategy_and_reason_per_filesystem() {
        let table = [
            (
                HF,
                Strategy::Buffered,
                "on hf-mount (fuse) at /mnt/hub — a userspace daemon serves it, where mmap page faults stall",
            ),
            (
                NFS_LOOPBACK,
                Strategy::Buffered,
                "on hf-mount (nfs4) at /mnt/hub — a userspace daemon serves it, where mmap page faults stall",
            ),
            (
                S3FS,
                Strategy::Buffered,
                "on FUSE (fuse.s3fs) at /mnt/s3 — mmap page faults stall on FUSE",
            ),
            (
                NFS,
                Strategy::Mmap,
                "on network filesystem (nfs4) at /mnt/nfs — mapped; pages shared",
            ),
            (
                EXT4,
                Strategy::Mmap,
                "on local filesystem (ext4) at / — mapping a local file costs no copy",
            ),
            (
                AUTOFS,
                Strategy::Mmap,
                "on filesystem (autofs) at /net — filesystem unknown, mapping is the default",
            ),
        ];
        for (line, strategy, words) in table {
            let m = mount(line);
            let d = choose(ReadMode::Auto, Origin::Default, Some(&m));
            assert_eq!(d.strategy, strategy, "{line}");
            assert!(d.to_string().starts_with(words), "{line}: {d}");
            assert_eq!(d.switchable(), strategy == Strategy::Buffered);
        }
        let d = choose(ReadMode::Auto, Origin::Default, None);
        assert_eq!(d.strategy, Strategy::Mmap);
        assert_eq!(d.to_string(), "filesystem unknown — mapping is the default");
    }

    #[test]
    fn explicit_modes_say_who_asked() {
        let m = mount(HF);
        let d = choose(ReadMode::Mmap, Origin::Caller, Some(&m));
        assert_eq!(d.strategy, Strategy::Mmap);
        assert_eq!(
            d.to_string(),
            "disable_mmap(false) was requested (on hf-mount (fuse) at /mnt/hub)"
        );
        assert!(!d.switchable());
        let d = choose(ReadMode::Buffered, Origin::Environment, None);
        assert_eq!(d.strategy, Strategy::Buffered);
        assert_eq!(d.to_string(), "SAFELOAD_DISABLE_MMAP=1 is set");
        assert!(
            !d.switchable(),
            "the guard never overrides an explicit mode"
        );
    }

    #[test]
    fn fallbacks_and_direct_io_are_part_of_the_reason() {
        let m = mount(EXT4);
        let mut d = choose(ReadMode::Auto, Origin::Default, Some(&m));
        d.mmap_refused(&std::io::Error::from_raw_os_error(19));
        assert_eq!(d.strategy, Strategy::Buffered);
        assert!(d.to_string().starts_with("mmap failed ("), "{d}");
        assert!(
            d.to_string().ends_with(
                "; on local filesystem (ext4) at / — mapping a local file costs no copy"
            ),
            "{d}"
        );
        assert!(!d.switchable(), "a refused map is not tried again");
        d.set_direct(DirectIo::Refused {
            error: "Invalid argument".into(),
        });
        assert!(
            d.to_string()
                .ends_with("; O_DIRECT refused (Invalid argument)"),
            "{d}"
        );
        assert_ne!(d.direct, DirectIo::On);
        d.set_direct(DirectIo::Dropped {
            why: crate::os::DirectDropped::Pieces.to_string(),
        });
        assert!(
            d.to_string().ends_with(
                "; direct I/O dropped: whole-block reads kept returning pieces that are not \
                 whole blocks"
            ),
            "{d}"
        );

        let mut d = choose(ReadMode::Auto, Origin::Default, Some(&mount(HF)));
        d.set_direct(DirectIo::On);
        assert_eq!(d.direct, DirectIo::On);
        let verdict = memory_guard(&[(3 << 30, true), (1 << 20, true)], Some(1 << 30));
        d.memory_guard(&verdict, 1 << 30);
        assert_eq!(d.strategy, Strategy::Mmap);
        assert_ne!(d.direct, DirectIo::On);
        assert!(
            d.to_string().starts_with(
                "buffered reads would need 3.04 GiB (margin included) but 1.00 GiB of memory is \
                 available, mapped instead (1 of 2 files read); on hf-mount"
            ),
            "{d}"
        );
    }

    #[test]
    fn direct_io_by_filesystem_and_residency() {
        use MountKind::*;
        let table = [
            // caller, kind, image, mostly cached -> direct
            (None, Some(HfMount), true, false, true),
            (None, Some(Fuse), true, false, true),
            (None, Some(Local), true, false, true),
            (None, Some(Local), true, true, false),
            (None, Some(Network), true, false, false),
            (None, None, true, false, false),
            (None, Some(Local), false, false, false),
            (Some(true), Some(Network), true, true, true),
            (Some(true), Some(Local), false, false, false),
            (Some(false), Some(HfMount), true, false, false),
        ];
        for (caller, kind, image, cached, expected) in table {
            assert_eq!(
                wants_direct_io(caller, kind, image, || cached),
                expected,
                "{caller:?} {kind:?} image={image} cached={cached}"
            );
        }
    }

    #[test]
    fn a_converting_load_converts_floating_tensors_only() {
        use Dtype::*;
        for from in [F64, F32, F16, BF16, F8_E4M3, F8_E5M2] {
            for to in [F32, F16, BF16] {
                let expected = (from != to).then_some(to.bitsize() / 8);
                assert_eq!(converts_to(from, to), expected, "{from} -> {to}");
            }
        }
        for from in [
            BOOL,
            U8,
            I8,
            I16,
            U16,
            I32,
            U32,
            I64,
            U64,
            F8_E4M3FNUZ,
            F8_E5M2FNUZ,
            F8_E8M0,
            F4,
            F6_E2M3,
            F6_E3M2,
            C64,
        ] {
            assert_eq!(converts_to(from, BF16), None, "{from} stays");
        }
        assert_eq!(converts_to(F32, F64), None, "F64 is not a target");
    }
}
