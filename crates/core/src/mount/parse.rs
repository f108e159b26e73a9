//! Turning one line of mount table text into a [`MountEntry`]: `mountinfo` lines through procfs with the fixes this crate needs on top, `/proc/mounts` and fstab lines by hand.
//!
//! Each parser takes the bytes of one line and gives `None` for a line it cannot read, so
//! that one bad line costs that line only. Each fix on top of procfs has a `NOTE:` and a test
//! showing the gap on real text.

use procfs_core::process::MountInfo;

use super::classify::classify_parts;
use super::entry::MountEntry;
use super::escape;

/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
///
/// Read by [`MountInfo::from_line`] (the numbered fields, the optional fields up to `-`, the
/// type); fixed on top: the line reaches it as text, its fields are decoded, and the two
/// option lists and the source are taken from the line as written.
pub(super) fn mountinfo_line(line: &[u8]) -> Option<MountEntry> {
    let line = line.trim_ascii();
    // NOTE: procfs reads `&str`, and a mount point need not be UTF-8 (the kernel writes its
    // bytes as they are): such bytes reach procfs escaped, and decoding the fields below gives
    // them back exactly.
    let text = escape::to_text(line);
    // NOTE: procfs's reader of a whole file (`MountInfos: FromBufRead`) fails the file on one
    // line it cannot read; one line at a time, that line alone is skipped.
    let info = MountInfo::from_line(&text).ok()?;
    let (options, source, super_options) = fields_as_written(line)?;
    let mount_point = info.mount_point.as_os_str().as_encoded_bytes();
    // NOTE: procfs splits on single spaces, so a run of two spaces before the `-` reads as an
    // empty field and shifts every field after it (`27 1 254:0  / / rw - ext4 /dev/vda rw` gives
    // root "" and options "/"). The kernel never writes an empty field there: such a line is
    // skipped rather than read shifted.
    if info.root.is_empty() || options.is_empty() || info.fs_type.is_empty() {
        return None;
    }
    if !mount_point.starts_with(b"/") {
        return None;
    }
    Some(new_entry(RawEntry {
        mount_id: Some(u64::try_from(info.mnt_id).ok()?),
        parent_id: Some(u64::try_from(info.pid).ok()?),
        device: Some(parse_device(info.majmin.as_bytes())?),
        root: info.root.as_bytes(),
        mount_point,
        fs_type: info.fs_type.as_bytes(),
        source,
        options,
        super_options,
    }))
}

/// The per-mount options, the source and the superblock options of a `mountinfo` line that
/// procfs has read, as the kernel wrote them.
///
/// NOTE: procfs parses both option lists into a `HashMap`, losing their order, and reads a
/// source of `none` (`fusectl none rw`, `tests/data/mountinfo-this-machine.txt`) or an empty
/// one as no source. The three are taken from the line where procfs read them: it splits on
/// single spaces, so the options are the sixth field, and the type, source and superblock
/// options follow the first `-` after them (decoding moves no space).
fn fields_as_written(line: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let mut fields = line.split(|&b| b == b' ');
    let options = fields.nth(5)?;
    fields.find(|field| *field == b"-")?;
    let _fs_type = fields.next()?;
    Some((options, fields.next()?, fields.next()?))
}

/// `/dev/sda1 / ext4 rw,relatime 0 0`
///
/// NOTE: by hand, because procfs's reader of `/proc/mounts` gives no field this crate could
/// use as it is: it does not decode `\040` (a space) and decodes `\134043` twice, turns the
/// options into a `HashMap`, fails fstab lines without the number columns, reads `&str`, and
/// has no entry point for one line (`procfs_gaps_in_proc_mounts` below).
pub(super) fn mounts_line(line: &[u8]) -> Option<MountEntry> {
    let line = line.trim_ascii_end();
    // The kernel's layout: six fields one space apart, of which the source may be empty.
    let exact: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let fields = match exact.as_slice() {
        [source, mount_point, fs_type, options, _, _]
            if mount_point.starts_with(b"/") && !fs_type.is_empty() && !options.is_empty() =>
        {
            (*source, *mount_point, *fs_type, *options)
        }
        // Otherwise fstab layout: whitespace-separated, the last three columns optional.
        _ => {
            let line = line.trim_ascii_start();
            if line.starts_with(b"#") {
                return None;
            }
            let loose: Vec<&[u8]> = line
                .split(u8::is_ascii_whitespace)
                .filter(|field| !field.is_empty())
                .collect();
            match loose.as_slice() {
                [source, mount_point, fs_type, rest @ ..] => (
                    *source,
                    *mount_point,
                    *fs_type,
                    rest.first().copied().unwrap_or(b""),
                ),
                _ => return None,
            }
        }
    };
    let (source, mount_point, fs_type, options) = fields;
    if !mount_point.starts_with(b"/") {
        return None;
    }
    Some(new_entry(RawEntry {
        mount_id: None,
        parent_id: None,
        device: None,
        root: b"/",
        mount_point,
        fs_type,
        source,
        options,
        super_options: b"",
    }))
}

/// The fields of one line, still escaped.
struct RawEntry<'a> {
    mount_id: Option<u64>,
    parent_id: Option<u64>,
    device: Option<(u32, u32)>,
    root: &'a [u8],
    mount_point: &'a [u8],
    fs_type: &'a [u8],
    source: &'a [u8],
    options: &'a [u8],
    super_options: &'a [u8],
}

/// NOTE: procfs leaves every `mountinfo` field as the kernel escaped it (`/mnt/my\040models`),
/// so root, mount point, type and source are decoded here, for both formats alike.
fn new_entry(raw: RawEntry<'_>) -> MountEntry {
    let fs_type = escape::decoded_string(raw.fs_type);
    let source = escape::decoded_string(raw.source);
    let options = String::from_utf8_lossy(raw.options).into_owned();
    let super_options = String::from_utf8_lossy(raw.super_options).into_owned();
    // Classified on the escaped options, so that a `\054` inside a value cannot split it.
    let kind = classify_parts(&fs_type, &source, &[&options, &super_options]);
    MountEntry {
        mount_id: raw.mount_id,
        parent_id: raw.parent_id,
        device: raw.device,
        root: escape::decoded_path(raw.root),
        mount_point: escape::decoded_path(raw.mount_point),
        fs_type,
        source,
        options,
        super_options,
        kind,
    }
}

/// `major:minor`, which procfs leaves as text.
fn parse_device(field: &[u8]) -> Option<(u32, u32)> {
    let colon = field.iter().position(|&b| b == b':')?;
    let major = parse_number(field.get(..colon)?)?;
    let minor = parse_number(field.get(colon.checked_add(1)?..)?)?;
    Some((major, minor))
}

fn parse_number(field: &[u8]) -> Option<u32> {
    // `FromStr` for integers accepts a leading `+`, which the kernel never writes.
    if !field.first().is_some_and(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(field).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use procfs_core::FromBufRead;
    use procfs_core::process::{MountInfo, MountInfos};

    use crate::mount::test_util::{fixture, mount_point_for, only_entry};
    use crate::mount::{Detection, MountEntry, MountKind, MountTable};

    // A host's /proc/mounts with an NFS share and hf-mount.
    const PROC_MOUNTS: &str = "mounts-nvme-nfs-hf-mount.txt";

    #[test]
    fn escaped_mount_points_are_decoded() {
        // As mountinfo shows `mkdir "/mnt/my models"; mount ... "/mnt/my models"`: the kernel
        // writes the space as \040.
        let entry = only_entry(
            "120 27 0:70 / /mnt/my\\040models rw,relatime - fuse hf-mount rw,user_id=0,group_id=0\n",
        );
        assert_eq!(entry.mount_point(), Path::new("/mnt/my models"));
        let table = MountTable::parse(&format!("27 1 254:0 / / rw - ext4 /dev/vda rw\n{}", {
            "120 27 0:70 / /mnt/my\\040models rw,relatime - fuse hf-mount rw\n"
        }));
        assert_eq!(
            mount_point_for(&table, "/mnt/my models/m.safetensors", None).as_deref(),
            Some("/mnt/my models"),
        );
        assert_eq!(
            mount_point_for(&table, "/mnt/my/models", None).as_deref(),
            Some("/")
        );
        // And the same in /proc/mounts, with a tab, a newline and a backslash.
        let entry = only_entry("/dev/sdb1 /mnt/a\\011b\\012c\\134d ext4 rw 0 0\n");
        assert_eq!(entry.mount_point(), Path::new("/mnt/a\tb\nc\\d"));
    }

    #[cfg(unix)]
    #[test]
    fn mount_points_that_are_not_utf8_are_kept_exactly() {
        use std::os::unix::ffi::OsStrExt;
        let table = MountTable::parse_bytes(b"60 27 0:60 / /mnt/\xff\xfe rw - ext4 /dev/vdb rw\n");
        assert_eq!(
            table.entries()[0].mount_point().as_os_str().as_bytes(),
            b"/mnt/\xff\xfe"
        );
        let table = MountTable::parse("60 27 0:60 / /mnt/\\377 rw - ext4 /dev/vdb rw\n");
        assert_eq!(
            table.entries()[0].mount_point().as_os_str().as_bytes(),
            b"/mnt/\xff"
        );
    }

    #[test]
    fn a_tmpfs_with_an_empty_source_keeps_its_fields_apart() {
        // As mountinfo shows a tmpfs mounted with an empty source string
        // (`mount("", "/dev/shm", "tmpfs", ...)`, as some container runtimes do): two spaces
        // between the type and the superblock options.
        let entry =
            only_entry("45 25 0:40 / /dev/shm rw,nosuid,nodev,relatime - tmpfs  rw,size=65536k\n");
        assert_eq!(entry.fs_type(), "tmpfs");
        assert_eq!(entry.source(), "");
        assert_eq!(entry.super_options(), "rw,size=65536k");
        assert_eq!(entry.kind(), MountKind::Local);
        // The same mount in /proc/mounts: the line starts with the empty source.
        let entry = only_entry(" /dev/shm tmpfs rw,nosuid,nodev,relatime,size=65536k 0 0\n");
        assert_eq!(entry.source(), "");
        assert_eq!(entry.mount_point(), Path::new("/dev/shm"));
        assert_eq!(entry.fs_type(), "tmpfs");
    }

    #[test]
    fn mountinfo_fields_are_all_read() {
        // A line from this kind of machine's /proc/self/mountinfo, with two optional fields.
        let entry = only_entry(
            "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 shared:7 - ext3 /dev/root rw,errors=continue\n",
        );
        assert_eq!(entry.mount_id(), Some(36));
        assert_eq!(entry.parent_id(), Some(35));
        assert_eq!(entry.device(), Some((98, 0)));
        assert_eq!(entry.root(), Path::new("/mnt1"));
        assert_eq!(entry.mount_point(), Path::new("/mnt2"));
        assert_eq!(entry.options(), "rw,noatime");
        assert_eq!(entry.fs_type(), "ext3");
        assert_eq!(entry.source(), "/dev/root");
        assert_eq!(entry.super_options(), "rw,errors=continue");
        assert_eq!(entry.option("noatime").as_deref(), Some(""));
        assert_eq!(entry.option("errors").as_deref(), Some("continue"));
        assert_eq!(entry.option("error"), None);
        // nsfs bind mounts have a root that is not a path.
        let entry = only_entry("600 30 0:4 net:[4026532008] /run/netns/ns1 rw - nsfs nsfs rw\n");
        assert_eq!(entry.root(), Path::new("net:[4026532008]"));
        // CRLF line ends and indentation are tolerated.
        assert_eq!(
            MountTable::parse("  22 27 0:21 / /proc rw - proc proc rw\r\n")
                .entries()
                .len(),
            1
        );
    }

    #[test]
    fn proc_mounts_lines_parse() {
        let table = MountTable::parse_mounts(fixture(PROC_MOUNTS));
        assert_eq!(table, MountTable::parse(fixture(PROC_MOUNTS)));
        let kinds: Vec<MountKind> = table.entries().iter().map(MountEntry::kind).collect();
        assert_eq!(
            kinds,
            [
                MountKind::Local,
                MountKind::Local,
                MountKind::Network,
                MountKind::HfMount
            ]
        );
        let nfs = &table.entries()[2];
        assert_eq!(nfs.mount_id(), None);
        assert_eq!(nfs.parent_id(), None);
        assert_eq!(nfs.device(), None);
        assert_eq!(nfs.root(), Path::new("/"));
        assert_eq!(nfs.source(), "fileserver:/export/models");
        assert_eq!(nfs.super_options(), "");
        assert_eq!(nfs.option("addr").as_deref(), Some("10.0.0.5"));
        // Without devices, every match is by path.
        let (entry, detected_by) = table
            .locate(Path::new("/mnt/hub/m.safetensors"), Some((0, 58)))
            .unwrap();
        assert_eq!(entry.kind(), MountKind::HfMount);
        assert_eq!(detected_by, Detection::PathPrefix);
    }

    #[test]
    fn fstab_layout_parses_too() {
        // As /etc/fstab is written: tabs, comments, omitted columns, swap.
        let table = MountTable::parse_mounts(fixture("fstab-by-hand.txt"));
        let points: Vec<&Path> = table
            .entries()
            .iter()
            .map(MountEntry::mount_point)
            .collect();
        assert_eq!(points, [Path::new("/"), Path::new("/mnt/nfs")]);
        assert_eq!(table.entries()[1].options(), "");
        assert_eq!(table.entries()[1].kind(), MountKind::Network);
    }

    #[test]
    fn malformed_lines_are_skipped() {
        let table = MountTable::parse_mountinfo(
            "\
27 1 254:0 / / rw - ext4 /dev/vda rw
this is not a mount table line
x 1 254:0 / /a rw - ext4 /dev/vda rw
28 y 254:0 / /b rw - ext4 /dev/vda rw
29 1 254 / /c rw - ext4 /dev/vda rw
30 1 254:z / /d rw - ext4 /dev/vda rw
31 1 254:0 / /e rw ext4 /dev/vda rw
32 1 254:0 / /f rw -
33 1 254:0 / /g rw - ext4
34 1 254:0 / /h rw - ext4 /dev/vda
35 1 254:0 / relative rw - ext4 /dev/vda rw
36 1 +254:0 / /i rw - ext4 /dev/vda rw
37 1 99999999999:0 / /j rw - ext4 /dev/vda rw
38 1 0:1
-
 - - - -
38 27 0:58 / /mnt/hub rw - fuse hf-mount rw
",
        );
        let ids: Vec<Option<u64>> = table.entries().iter().map(MountEntry::mount_id).collect();
        assert_eq!(ids, [Some(27), Some(38)]);
        let table = MountTable::parse_mounts(
            "onlyone\ntwo fields\nsrc relative ext4 rw 0 0\n/dev/a /ok ext4 rw 0 0\n",
        );
        assert_eq!(table.entries().len(), 1);
    }

    #[test]
    fn no_input_makes_the_parsers_panic() {
        // Every truncation of real lines, and pseudo-random bytes from a small generator.
        let text: String = [
            "mountinfo-hf-mount-fuse.txt",
            "mountinfo-hf-mount-nfs4.txt",
            "mountinfo-nfs-inside-xfs.txt",
            PROC_MOUNTS,
        ]
        .map(fixture)
        .concat();
        for end in 0..=text.len() {
            let bytes = &text.as_bytes()[..end];
            let _ = MountTable::parse_bytes(bytes);
            let _ = MountTable::parse_bytes(&text.as_bytes()[end..]);
        }
        let alphabet = b" \t\n\\-:/0123456789abcfuse.";
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..2000 {
            let mut line = Vec::new();
            for _ in 0..(state % 80) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                line.push(alphabet[(state % alphabet.len() as u64) as usize]);
            }
            let table = MountTable::parse_bytes(&line);
            for entry in table.entries() {
                let _ = table.find(entry.mount_point(), entry.device());
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Where procfs reads a line differently, shown on real text
    // -----------------------------------------------------------------------------------------

    #[test]
    fn procfs_leaves_mountinfo_escapes_which_are_decoded_here() {
        // As mountinfo shows an sshfs mount of a remote directory with a space in its name, at
        // a mount point with one too.
        let line = "120 27 0:70 / /mnt/my\\040models rw,nosuid,nodev,relatime - fuse.sshfs user@host:/srv/my\\040models rw,user_id=0,group_id=0";
        let info = MountInfo::from_line(line).unwrap();
        assert_eq!(info.mount_point, Path::new("/mnt/my\\040models"));
        assert_eq!(
            info.mount_source.as_deref(),
            Some("user@host:/srv/my\\040models")
        );
        let entry = only_entry(line);
        assert_eq!(entry.mount_point(), Path::new("/mnt/my models"));
        assert_eq!(entry.source(), "user@host:/srv/my models");
        assert_eq!(entry.kind(), MountKind::Fuse);
    }

    #[test]
    fn procfs_option_maps_lose_the_lists_which_are_kept_here() {
        // An NFS mount whose superblock options hold a comma, escaped, inside a value.
        let line = "86 27 0:53 / /mnt/x rw,nosuid,relatime - nfs4 fileserver:/x rw,fsc=a\\054addr=127.0.0.1,addr=10.0.0.5";
        let info = MountInfo::from_line(line).unwrap();
        // A map: the same options, in no order, each value still escaped.
        assert_eq!(info.mount_options.len(), 3);
        assert_eq!(
            info.super_options.get("fsc"),
            Some(&Some("a\\054addr=127.0.0.1".to_owned()))
        );
        let entry = only_entry(line);
        assert_eq!(entry.options(), "rw,nosuid,relatime");
        assert_eq!(
            entry.super_options(),
            "rw,fsc=a\\054addr=127.0.0.1,addr=10.0.0.5"
        );
        assert_eq!(entry.option("fsc").as_deref(), Some("a,addr=127.0.0.1"));
    }

    #[test]
    fn procfs_reads_a_none_or_empty_source_as_no_source() {
        let this_machine = fixture("mountinfo-this-machine.txt");
        let fusectl = this_machine
            .lines()
            .find(|line| line.contains(" - fusectl "))
            .unwrap();
        assert_eq!(MountInfo::from_line(fusectl).unwrap().mount_source, None);
        assert_eq!(only_entry(fusectl).source(), "none");
        let empty = "45 25 0:40 / /dev/shm rw,nosuid,nodev,relatime - tmpfs  rw,size=65536k";
        assert_eq!(MountInfo::from_line(empty).unwrap().mount_source, None);
        assert_eq!(only_entry(empty).source(), "");
    }

    #[test]
    fn procfs_fails_a_whole_file_on_one_line_it_cannot_read() {
        let this_machine = fixture("mountinfo-this-machine.txt");
        assert!(MountInfos::from_buf_read(this_machine.as_bytes()).is_ok());
        let with_a_bad_line = format!("{this_machine}38 1 0:1\n");
        assert!(MountInfos::from_buf_read(with_a_bad_line.as_bytes()).is_err());
        assert_eq!(
            MountTable::parse_mountinfo(&with_a_bad_line)
                .entries()
                .len(),
            20
        );
        // And it reads text: a mount point that is not UTF-8 fails the file too.
        let not_utf8: &[u8] = b"60 27 0:60 / /mnt/\xff rw - ext4 /dev/vdb rw\n";
        assert!(MountInfos::from_buf_read(not_utf8).is_err());
        assert_eq!(MountTable::parse_bytes(not_utf8).entries().len(), 1);
    }

    #[test]
    fn a_run_of_spaces_before_the_separator_is_skipped_not_read_shifted() {
        let line = "27 1 254:0  / / rw - ext4 /dev/vda rw";
        let info = MountInfo::from_line(line).unwrap();
        assert_eq!(info.root, "");
        assert_eq!(info.mount_point, Path::new("/"));
        assert!(MountTable::parse(line).entries().is_empty());
        for line in [
            "27 1 254:0 /  / rw - ext4 /dev/vda rw",
            "27 1 254:0 / /  rw - ext4 /dev/vda rw",
            "27  1 254:0 / / rw - ext4 /dev/vda rw",
        ] {
            assert!(MountTable::parse(line).entries().is_empty(), "{line}");
        }
        // Between optional fields, a run of spaces shifts nothing.
        assert_eq!(
            only_entry("27 1 254:0 / / rw shared:1  master:2 - ext4 /dev/vda rw").fs_type(),
            "ext4"
        );
    }

    #[test]
    fn procfs_gaps_in_proc_mounts() {
        let read = |text: &[u8]| Vec::<procfs_core::MountEntry>::from_buf_read(text);
        // `\040` is not decoded.
        let spaced = "/dev/sdb1 /mnt/my\\040models ext4 rw,relatime 0 0";
        assert_eq!(
            read(spaced.as_bytes()).unwrap()[0].fs_file,
            "/mnt/my\\040models"
        );
        assert_eq!(
            only_entry(spaced).mount_point(),
            Path::new("/mnt/my models")
        );
        // `\134043` (a backslash, then `043`) is decoded twice.
        let hash = "/dev/sdb1 /mnt/a\\134043b ext4 rw 0 0";
        assert_eq!(read(hash.as_bytes()).unwrap()[0].fs_file, "/mnt/a#b");
        assert_eq!(only_entry(hash).mount_point(), Path::new("/mnt/a\\043b"));
        // The options become a map.
        let this_machine = fixture("mounts-this-machine.txt");
        let root = &read(this_machine.as_bytes()).unwrap()[5];
        assert_eq!(root.fs_file, "/");
        assert_eq!(
            root.fs_mntops.get("resuid"),
            Some(&Some("65534".to_owned()))
        );
        // fstab lines that leave out the number columns fail, and so does the whole file
        // for one line, and for bytes that are not UTF-8.
        assert!(read(b"fileserver:/export   /mnt/nfs   nfs4\n").is_err());
        assert!(read(format!("{this_machine}onlyone\n").as_bytes()).is_err());
        assert!(read(b"/dev/sdb1 /mnt/\xff ext4 rw 0 0\n").is_err());
    }

    #[test]
    fn this_machines_own_tables_parse_and_agree() {
        let mountinfo = MountTable::parse(fixture("mountinfo-this-machine.txt"));
        let mounts = MountTable::parse(fixture("mounts-this-machine.txt"));
        assert_eq!(mountinfo.entries().len(), 20);
        assert_eq!(mounts.entries().len(), 20);
        assert!(mountinfo.entries().iter().all(|e| e.device().is_some()));
        assert!(mounts.entries().iter().all(|e| e.device().is_none()));
        // Captured together, the two files list the same mounts in the same order.
        for (a, b) in mountinfo.entries().iter().zip(mounts.entries()) {
            assert_eq!(a.mount_point(), b.mount_point());
            assert_eq!((a.fs_type(), a.source()), (b.fs_type(), b.source()));
            assert_eq!(a.kind(), b.kind(), "{a:?}");
        }
        // The ext4 root, by its device.
        let root = mountinfo.find(Path::new("/work/model.safetensors"), Some((254, 0)));
        let root = root.unwrap();
        assert_eq!((root.fs_type(), root.source()), ("ext4", "/dev/vda"));
        assert_eq!(root.kind(), MountKind::Local);
        assert_eq!(root.option("resgid").as_deref(), Some("65534"));
        // /dev/pts and /dev/shm are each mounted twice, the second over the first.
        let pts = mountinfo.find(Path::new("/dev/pts/0"), None).unwrap();
        assert_eq!((pts.mount_id(), pts.parent_id()), (Some(29), Some(26)));
        let shm = mountinfo.locate(Path::new("/dev/shm/x"), Some((0, 27)));
        assert_eq!(shm.unwrap().1, Detection::Device);
        // The v1 memory controller, and cgroup2 next to the v1 controllers.
        let unified = mountinfo
            .find(Path::new("/sys/fs/cgroup/unified"), None)
            .unwrap();
        assert_eq!(unified.fs_type(), "cgroup2");
        let memory = mountinfo
            .find(Path::new("/sys/fs/cgroup/memory/x"), None)
            .unwrap();
        assert_eq!(memory.super_options(), "rw,memory");
        let kinds: Vec<MountKind> = mountinfo.entries().iter().map(MountEntry::kind).collect();
        assert!(
            kinds.iter().all(|&kind| kind == MountKind::Local),
            "{kinds:?}"
        );
    }
}
