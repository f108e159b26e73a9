//! `Loader::dtype`: a converting load gives, tensor by tensor, what converting
//! each loaded tensor alone gives (`Tensor::to_dtype`, the naive twin), in
//! every mode; tensors it does not convert stay as they are.

use crate::common::*;
use safeload::{Dtype, Loader, StateDict};
use tempfile::tempdir;

/// Every way a file's bytes reach a converting load.
fn modes() -> Vec<(&'static str, Loader)> {
    let mut modes = read_modes();
    modes.push((
        "mmap-populate",
        Loader::new().disable_mmap(false).populate(true),
    ));
    modes
}

/// A checkpoint of the floating dtypes in sizes that cross the read chunk
/// (so one tensor is converted by several jobs), with integers, a bool and
/// the types that stay, in several shards.
fn write_mixed(dir: &std::path::Path) -> std::path::PathBuf {
    let mut specs = every_dtype();
    for (dtype, n) in [
        (Dtype::F32, 300_000),
        (Dtype::BF16, 700_001),
        (Dtype::F16, 5),
        (Dtype::F64, 70_000),
        (Dtype::F8_E4M3, 1_000_003),
        (Dtype::F8_E5M2, 4096),
    ] {
        let name = format!("big.{dtype:?}").to_lowercase();
        specs.push(spec(&name, dtype, &[n]));
    }
    write_sharded(dir, &specs, 4)
}

fn by_name(sd: &StateDict, name: &str) -> safeload::Tensor {
    sd.get(name).unwrap().clone()
}

#[test]
fn a_converting_load_equals_converting_each_tensor() {
    let dir = tempdir().unwrap();
    let index = write_mixed(dir.path());
    let plain = safeload::load_state_dict(&index, Some(false)).unwrap();
    for to in [Dtype::BF16, Dtype::F16, Dtype::F32] {
        for (mode, loader) in modes() {
            let sd = loader.read_size(256 << 10).dtype(to).load(&index).unwrap();
            assert_eq!(sd.len(), plain.len(), "{mode}");
            let mut converted = 0;
            let mut overflowed = 0u64;
            for (name, original) in plain.iter() {
                let got = by_name(&sd, name);
                let floating = matches!(
                    original.dtype(),
                    Dtype::F64
                        | Dtype::F32
                        | Dtype::F16
                        | Dtype::BF16
                        | Dtype::F8_E4M3
                        | Dtype::F8_E5M2
                );
                if floating && original.dtype() != to {
                    let twin = original.to_dtype(to).unwrap();
                    assert_eq!(got.dtype(), to, "{mode} {name}");
                    assert_eq!(got.shape(), original.shape(), "{mode} {name}");
                    assert_eq!(got.as_bytes(), twin.as_bytes(), "{mode} {name} -> {to}");
                    assert!(got.is_aligned(), "{mode} {name}");
                    converted += 1;
                    let mut dst = vec![0u8; twin.nbytes() as usize];
                    overflowed += safeload::convert::convert(
                        original.dtype(),
                        to,
                        original.as_bytes(),
                        &mut dst,
                    )
                    .unwrap()
                    .overflowed();
                } else {
                    assert_eq!(got.dtype(), original.dtype(), "{mode} {name} stays");
                    assert_eq!(got.as_bytes(), original.as_bytes(), "{mode} {name} stays");
                }
            }
            let report = sd.report();
            assert_eq!(
                report.files.iter().map(|f| f.converted).sum::<usize>(),
                converted,
                "{mode} -> {to}"
            );
            assert_eq!(report.overflowed(), overflowed, "{mode} -> {to}");
        }
    }
}

#[test]
fn a_filtered_converting_load_from_an_open_checkpoint() {
    let dir = tempdir().unwrap();
    let index = write_mixed(dir.path());
    let keep = |name: &str| name.starts_with("big.") || name.starts_with("i64");
    for (mode, loader) in modes() {
        let ck = loader.clone().dtype(Dtype::BF16).open(&index).unwrap();
        let from_ck = ck.load_filtered(keep).unwrap();
        let direct = loader.dtype(Dtype::BF16).filter(keep).load(&index).unwrap();
        assert_eq!(loaded(&from_ck), loaded(&direct), "{mode}");
        assert!(
            from_ck
                .get("big.f32")
                .is_some_and(|t| t.dtype() == Dtype::BF16)
        );
        assert!(
            from_ck
                .get("i64.matrix")
                .is_some_and(|t| t.dtype() == Dtype::I64)
        );
    }
}

#[test]
fn to_dtype_refuses_what_it_cannot_convert() {
    let dir = tempdir().unwrap();
    let path = write_single(dir.path(), &every_dtype());
    let sd = safeload::load_state_dict(&path, None).unwrap();
    let ints = sd.get("i32.matrix").unwrap();
    let err = ints.to_dtype(Dtype::F32).unwrap_err();
    assert!(
        matches!(err.kind(), safeload::ErrorKind::UnsupportedConversion { tensor, from: Dtype::I32, to: Dtype::F32 } if tensor.as_deref() == Some("i32.matrix")),
        "{err}"
    );
    assert_eq!(err.path(), Some(path.as_path()));
    let f = sd.get("f32.matrix").unwrap();
    assert!(f.to_dtype(Dtype::F64).is_err(), "F64 is not a target");
    let same = f.to_dtype(Dtype::F32).unwrap();
    assert_eq!(
        same.as_bytes().as_ptr(),
        f.as_bytes().as_ptr(),
        "same dtype: no copy"
    );
    let empty = sd.get("f32.empty").unwrap().to_dtype(Dtype::BF16).unwrap();
    assert_eq!((empty.nbytes(), empty.shape()), (0, &[0, 3][..]));
}
