//! Weights straight into device memory, on the CPU stand-in: every byte where its
//! tensor's view says (whole, a rank's part, a slice, converted), in chunks of at most a
//! staging buffer; a failed copy and a cancel end the load with an error and leave no
//! slab or staging buffer alive; a large load's anonymous memory is the ring (in a child,
//! `memory.rs`). The same bytes over every source are the contract's ("to a device",
//! `contract/apis.rs`).

mod memory;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use safeload::device::{LoadToDevice, Part, Route, StandIn, ToDevice};
use safeload::{Dtype, ErrorKind, Loader};

use crate::common::{self, Spec, read_modes, spec, write_sharded};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// Tensors of every size class, in three files: small ones that share a chunk, and large
/// ones that span several at the tests' 256 KiB staging buffers.
fn specs() -> Vec<Spec> {
    vec![
        spec("a.small", Dtype::F32, &[3, 5]),
        spec("a.bias", Dtype::BF16, &[7]),
        spec("b.large", Dtype::BF16, &[600, 1000]),
        spec("b.scalar", Dtype::I64, &[]),
        spec("c.empty", Dtype::F16, &[0, 4]),
        spec("c.odd", Dtype::U8, &[300_001]),
        spec("d.wide", Dtype::F32, &[64, 3001]),
        spec("e.f8", Dtype::F8_E4M3, &[1000, 333]),
    ]
}

/// A loader with a small ring, so that the few MiB of [`specs`] make many chunks.
fn small_ring(loader: Loader) -> Loader {
    loader.staging(3, 256 * KIB)
}

#[test]
fn every_byte_lands_where_its_tensor_says_in_every_mode() {
    let dir = tempfile::tempdir().unwrap();
    let index = write_sharded(dir.path(), &specs(), 3);
    for (mode, loader) in read_modes() {
        let device = StandIn::new();
        let loaded = small_ring(loader).load_to_device(&index, &device).unwrap();
        assert_eq!(loaded.len(), specs().len(), "{mode}");
        for want in specs() {
            let t = loaded.get(&want.name).unwrap();
            assert_eq!(
                (t.dtype(), t.shape()),
                (want.dtype, &want.shape[..]),
                "{mode}"
            );
            assert_eq!(t.nbytes(), want.data.len(), "{mode}: {}", want.name);
            assert_eq!(t.offset() % 256, 0, "{mode}: {} aligned", want.name);
            assert_eq!(t.device_ptr() % 256, 0);
            assert!(
                t.to_host().unwrap() == want.data,
                "{mode}: {} differs",
                want.name
            );
        }
        let report = loaded.report();
        let want_route = match mode {
            "mmap" => Route::Mapped,
            "buffered" => Route::Read,
            _ => Route::Direct,
        };
        let total: usize = specs().iter().map(|s| s.data.len()).sum();
        assert_eq!(report.bytes(), total as u64, "{mode}");
        for file in &report.files {
            assert_eq!(file.route, want_route, "{mode}: {file:?}");
            // One copy per full buffer, and the last one's remainder: the padding
            // between tensors is at most 255 bytes each.
            let most = (file.bytes as usize + file.tensors * 256).div_ceil(256 * KIB);
            assert!(file.chunks <= most, "{mode}: {file:?}");
            assert!(file.chunks >= (file.bytes as usize).div_ceil(256 * KIB));
        }
        assert_eq!(device.copies(), report.chunks() as u64);
        // Three buffers at most, none alive once the load is done; a slab per file.
        assert!(device.staging_made() <= 3, "{mode}");
        assert_eq!(device.live_staging(), 0, "{mode}");
        assert_eq!(device.live_slabs(), 3, "{mode}");
        drop(loaded);
        assert_eq!(
            device.live_slabs(),
            0,
            "{mode}: the slabs go with the tensors"
        );
    }
}

#[test]
fn the_default_ring_copies_a_32_mib_chunk_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let specs = [
        spec("x", Dtype::U8, &[40 * MIB + 5]),
        spec("y", Dtype::F32, &[3 * MIB]),
    ];
    let path = common::write_single(dir.path(), &specs);
    let device = StandIn::new().discard_bytes();
    let loaded = Loader::new().load_to_device(&path, &device).unwrap();
    let file = &loaded.report().files[0];
    // 12 MiB then 40 MiB (the serializer puts the F32 tensor first): two chunks of at
    // most 32 MiB.
    assert_eq!(file.chunks, 2, "{file:?}");
    assert_eq!(device.bytes_copied(), 52 * MIB as u64 + 5);
    assert!(device.staging_made() <= 4);
}

/// The naive part of `want` at `part`: its bytes and shape.
fn naive_part(want: &Spec, part: &Part) -> (Vec<u8>, Vec<usize>) {
    use crate::contract::case::{naive_shard, naive_slice};
    let ranges = match part {
        Part::Whole => Vec::new(),
        Part::Shard { dim, rank, world } => naive_shard(&want.shape, *dim, *rank, *world),
        Part::Slice(ranges) => ranges.clone(),
        Part::Skip => unreachable!(),
    };
    let shape = ranges
        .iter()
        .map(|r| r.len())
        .chain(want.shape[ranges.len()..].iter().copied())
        .collect();
    (naive_slice(want, &ranges).unwrap(), shape)
}

#[test]
fn a_shard_and_a_slice_send_only_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let index = write_sharded(dir.path(), &specs(), 2);
    let part = |name: &str| match name {
        "b.large" => Part::Shard {
            dim: 1,
            rank: 1,
            world: 3,
        },
        "d.wide" => Part::Shard {
            dim: 0,
            rank: 0,
            world: 4,
        },
        "e.f8" => Part::Slice(vec![10..900, 7..300]),
        "c.odd" => Part::Skip,
        _ => Part::Whole,
    };
    for (mode, loader) in read_modes() {
        let device = StandIn::new();
        let ck = small_ring(loader).open(&index).unwrap();
        let loaded = ck.to_device_parts(&device, |t| part(t.name())).unwrap();
        assert!(loaded.get("c.odd").is_none(), "{mode}: skipped");
        let mut sent = 0;
        for want in specs().iter().filter(|s| s.name != "c.odd") {
            let (bytes, shape) = naive_part(want, &part(&want.name));
            let t = loaded.get(&want.name).unwrap();
            assert_eq!(t.shape(), shape.as_slice(), "{mode}: {}", want.name);
            assert!(
                t.to_host().unwrap() == bytes,
                "{mode}: {} differs",
                want.name
            );
            sent += bytes.len();
        }
        let report = loaded.report();
        assert_eq!(report.bytes(), sent as u64, "{mode}");
        // The copies move the parts and the padding between them, nothing more.
        let padding = 256 * specs().len() as u64;
        assert!(device.bytes_copied() <= sent as u64 + padding, "{mode}");
        // The reads: the parts, and the gaps of merged rows (never a whole large tensor).
        let read: u64 = report.files.iter().map(|f| f.bytes_read).sum();
        let whole: usize = specs().iter().map(|s| s.data.len()).sum();
        assert!(read < whole as u64, "{mode}: read {read} of {whole}");
    }
}

#[test]
fn converted_tensors_arrive_in_the_loads_dtype() {
    use crate::contract::case::{naive_convert, same_floats};
    let dir = tempfile::tempdir().unwrap();
    let index = write_sharded(dir.path(), &specs(), 2);
    for to in [Dtype::BF16, Dtype::F32, Dtype::F16] {
        for (mode, loader) in read_modes() {
            let device = StandIn::new();
            let loaded = small_ring(loader.dtype(to))
                .load_to_device(&index, &device)
                .unwrap();
            let mut converted = 0;
            for want in specs() {
                let t = loaded.get(&want.name).unwrap();
                let got = t.to_host().unwrap();
                match naive_convert(want.dtype, to, &want.data) {
                    Some(bytes) => {
                        converted += 1;
                        assert_eq!(t.dtype(), to, "{mode}");
                        same_floats(to, &got, &bytes)
                            .unwrap_or_else(|e| panic!("{mode} {to:?}: {}: {e}", want.name));
                    }
                    None => assert!(got == want.data, "{mode} {to:?}: {}", want.name),
                }
            }
            let counted: usize = loaded.report().files.iter().map(|f| f.converted).sum();
            assert_eq!(counted, converted, "{mode} {to:?}");
        }
    }
}

/// The stand-in's counters say nothing was left alive.
fn nothing_left(device: &StandIn, what: &str) {
    assert_eq!(device.live_slabs(), 0, "{what}: a slab left");
    assert_eq!(device.live_staging(), 0, "{what}: a staging buffer left");
}

#[test]
fn a_failed_copy_ends_the_load_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let index = write_sharded(dir.path(), &specs(), 3);
    for (mode, loader) in read_modes() {
        let copies = {
            let device = StandIn::new();
            small_ring(loader.clone())
                .load_to_device(&index, &device)
                .unwrap();
            device.copies()
        };
        assert!(copies > 10, "{mode}: {copies} copies");
        for n in [1, 2, copies / 2, copies] {
            let what = format!("{mode}, copy {n} of {copies} failing");
            let device = StandIn::new()
                .latency(Duration::from_micros(200))
                .fail_on_copy(n);
            let err = small_ring(loader.clone())
                .load_to_device(&index, &device)
                .unwrap_err();
            assert!(matches!(err.kind(), ErrorKind::Io { .. }), "{what}: {err}");
            let text = err.to_string();
            assert!(text.contains("failed copy"), "{what}: {text}");
            assert!(
                err.path()
                    .is_some_and(|p| p.extension().is_some_and(|e| e == "safetensors")),
                "{what}: the error names the file: {text}"
            );
            nothing_left(&device, &what);
            assert!(device.copies() < copies, "{what}: the load went on");
        }
    }
}

#[test]
fn a_cancel_mid_load_ends_it_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let index = write_sharded(dir.path(), &specs(), 3);
    for (mode, loader) in read_modes() {
        // Slow copies: the load lasts long enough to be cancelled in the middle.
        let device = StandIn::new().latency(Duration::from_millis(20));
        let flag = Arc::new(AtomicBool::new(false));
        let loader = small_ring(loader).cancel_on(Arc::clone(&flag));
        let err = std::thread::scope(|scope| {
            let load = scope.spawn(|| loader.load_to_device(&index, &device));
            while device.copies() < 2 && !load.is_finished() {
                std::thread::sleep(Duration::from_millis(1));
            }
            flag.store(true, Ordering::Relaxed);
            load.join().unwrap().unwrap_err()
        });
        assert_eq!(err.kind(), &ErrorKind::Cancelled, "{mode}: {err}");
        nothing_left(&device, mode);
        let whole = {
            let device = StandIn::new();
            small_ring(Loader::new())
                .load_to_device(&index, &device)
                .unwrap();
            device.copies()
        };
        assert!(
            device.copies() < whole,
            "{mode}: cancelled after the last copy"
        );
        // Set again, a load fails at once.
        let err = loader.load_to_device(&index, &StandIn::new()).unwrap_err();
        assert_eq!(err.kind(), &ErrorKind::Cancelled);
    }
}

#[test]
fn a_part_a_shard_refuses_fails_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let index = write_sharded(dir.path(), &specs(), 2);
    let device = StandIn::new();
    let ck = Loader::new().open(&index).unwrap();
    let err = ck
        .to_device_parts(&device, |t| match t.name() {
            "a.small" => Part::Shard {
                dim: 5,
                rank: 0,
                world: 2,
            },
            _ => Part::Whole,
        })
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::InvalidSlice { .. }),
        "{err}"
    );
    assert!(err.path().is_some(), "{err}");
    nothing_left(&device, "a refused part");
}

#[test]
fn the_filter_leaves_tensors_out() {
    let dir = tempfile::tempdir().unwrap();
    let index = write_sharded(dir.path(), &specs(), 3);
    let device = StandIn::new();
    let loaded = Loader::new()
        .filter(|n| n.starts_with("b."))
        .load_to_device(&index, &device)
        .unwrap();
    let names: Vec<&str> = loaded.iter().map(|t| t.name()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.iter().all(|n| n.starts_with("b.")));
    // Only the files that hold them have a slab.
    assert_eq!(loaded.report().files.len(), device.live_slabs());
}
