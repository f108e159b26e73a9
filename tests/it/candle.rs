//! The `candle` feature: tensors, state dicts and checkpoints as candle
//! tensors, equal value for value to what safeload loads, in every read mode
//! (`read_modes`); a model built through the lazy `VarBuilder`;
//! tensor-parallel parts through the sharded one. `cargo test --features
//! candle --test it candle::`.

use crate::common::*;
use candle_core::{DType, Device, IndexOp, Module};
use safeload::candle::{IntoCandle, ToCandle};
use safeload::{Checkpoint, Dtype, Loader};
use tempfile::tempdir;

/// A candle tensor's bytes, little-endian, as safeload holds them.
fn bytes_of(t: &candle_core::Tensor) -> Vec<u8> {
    let t = t.flatten_all().unwrap();
    match t.dtype() {
        DType::U8 => t.to_vec1::<u8>().unwrap(),
        DType::U32 => t
            .to_vec1::<u32>()
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::I16 => t
            .to_vec1::<i16>()
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::I32 => t
            .to_vec1::<i32>()
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::I64 => t
            .to_vec1::<i64>()
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::F16 => t
            .to_vec1::<half::f16>()
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::BF16 => t
            .to_vec1::<half::bf16>()
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::F32 => t
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::F64 => t
            .to_vec1::<f64>()
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        other => panic!("no byte view of {other:?} here"),
    }
}

#[test]
fn every_dtype_maps_as_documented() {
    let dir = tempdir().unwrap();
    let path = write_single(dir.path(), &every_dtype());
    let dev = Device::Cpu;
    for (mode, loader) in read_modes() {
        let sd = loader.load(&path).unwrap();
        for (name, t) in sd.iter() {
            let result = t.to_candle(&dev);
            match t.dtype() {
                Dtype::F8_E5M2 | Dtype::F8_E4M3FNUZ | Dtype::F8_E5M2FNUZ | Dtype::C64 => {
                    assert!(result.is_err(), "{mode} {name}: candle has no such dtype");
                }
                Dtype::U64 => {
                    // Random bytes: values past i64::MAX are refused, others map.
                    let fits = t.as_bytes().chunks(8).all(|c| c[7] < 0x80);
                    assert_eq!(result.is_ok(), fits, "{mode} {name}");
                }
                Dtype::BOOL => {
                    let c = result.unwrap();
                    assert_eq!(c.dtype(), DType::U8);
                    assert_eq!(
                        bytes_of(&c),
                        t.as_bytes(),
                        "{mode} {name}: bools are 0 and 1"
                    );
                }
                Dtype::I8 => {
                    let c = result.unwrap();
                    let wide: Vec<i16> = c.flatten_all().unwrap().to_vec1().unwrap();
                    let expected: Vec<i16> =
                        t.as_bytes().iter().map(|&b| i16::from(b as i8)).collect();
                    assert_eq!(wide, expected, "{mode} {name}");
                }
                Dtype::U16 => {
                    let c = result.unwrap();
                    let wide: Vec<u32> = c.flatten_all().unwrap().to_vec1().unwrap();
                    let expected: Vec<u32> = t
                        .as_bytes()
                        .chunks(2)
                        .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))
                        .collect();
                    assert_eq!(wide, expected, "{mode} {name}");
                }
                Dtype::F4 | Dtype::F6_E2M3 | Dtype::F6_E3M2 | Dtype::F8_E8M0 | Dtype::F8_E4M3 => {
                    let c = result.unwrap();
                    assert_eq!(c.dims(), t.shape(), "{mode} {name}");
                }
                _ => {
                    let c = result.unwrap();
                    assert_eq!(c.dims(), t.shape(), "{mode} {name}");
                    assert_eq!(bytes_of(&c), t.as_bytes(), "{mode} {name}");
                }
            }
        }
    }
}

#[test]
fn converting_into_candle_is_safeloads_conversion() {
    let dir = tempdir().unwrap();
    let path = write_single(dir.path(), &every_dtype());
    let sd = safeload::load_state_dict(&path, None).unwrap();
    let dev = Device::Cpu;
    for name in [
        "f32.matrix",
        "f64.matrix",
        "bf16.matrix",
        "f16.matrix",
        "f8_e4m3.matrix",
        "f8_e5m2.matrix",
    ] {
        let t = sd.get(name).unwrap();
        for (to, dtype) in [
            (Dtype::BF16, DType::BF16),
            (Dtype::F16, DType::F16),
            (Dtype::F32, DType::F32),
        ] {
            let c = t.to_candle_as(dtype, &dev).unwrap();
            assert_eq!(c.dtype(), dtype);
            assert_eq!(
                bytes_of(&c),
                t.to_dtype(to).unwrap().as_bytes(),
                "{name} -> {to}"
            );
        }
    }
    // Integers go through candle's own conversion.
    let ids = sd
        .get("i64.matrix")
        .unwrap()
        .to_candle_as(DType::F32, &dev)
        .unwrap();
    assert_eq!(ids.dtype(), DType::F32);
}

#[test]
fn a_model_built_through_the_var_builder_in_both_modes() {
    let dir = tempdir().unwrap();
    // A linear layer 3 -> 2 with known weights, in BF16-friendly values.
    let w: Vec<f32> = vec![1.0, 2.0, 3.0, -1.0, 0.5, 0.25];
    let b: Vec<f32> = vec![0.5, -0.5];
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (wb, bb) = (bytes(&w), bytes(&b));
    let path = dir.path().join("model.safetensors");
    safetensors::serialize_to_file(
        [
            (
                "proj.weight",
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 3], &wb)
                    .unwrap(),
            ),
            (
                "proj.bias",
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &bb)
                    .unwrap(),
            ),
        ],
        None,
        &path,
    )
    .unwrap();
    let dev = Device::Cpu;
    let x = candle_core::Tensor::new(&[[1.0f32, 1.0, 2.0]], &dev).unwrap();
    for (mode, loader) in read_modes() {
        for dtype in [DType::F32, DType::BF16] {
            let vb = safeload::candle::var_builder_from(loader.open(&path).unwrap(), dtype, &dev);
            assert!(vb.contains_tensor("proj.weight"));
            let layer = candle_nn::linear(3, 2, vb.pp("proj")).unwrap();
            let y = layer.forward(&x.to_dtype(dtype).unwrap()).unwrap();
            let y: Vec<f32> = y
                .to_dtype(DType::F32)
                .unwrap()
                .i(0)
                .unwrap()
                .to_vec1()
                .unwrap();
            // 1 + 2 + 6 + 0.5 = 9.5 ; -1 + 0.5 + 0.5 - 0.5 = -0.5
            assert_eq!(y, [9.5, -0.5], "{mode} {dtype:?}");
            // A wrong shape is candle's shape error.
            assert!(vb.get((3, 3), "proj.weight").is_err());
        }
    }
    let vb = safeload::candle::var_builder(&path, DType::F32, &dev).unwrap();
    assert!(vb.get((2, 3), "missing").is_err());
}

#[test]
fn the_sharded_var_builder_reads_a_ranks_part() {
    let dir = tempdir().unwrap();
    let index = write_sharded(dir.path(), &every_dtype(), 2);
    let dev = Device::Cpu;
    let whole = safeload::load_state_dict(&index, None).unwrap();
    let w = whole.get("f32.matrix").unwrap().to_candle(&dev).unwrap(); // 4 x 6
    for (mode, loader) in read_modes() {
        let vb = safeload::candle::sharded_var_builder_from(
            loader.open(&index).unwrap(),
            DType::F32,
            &dev,
        );
        for (dim, world) in [(0, 2), (1, 3), (1, 4)] {
            for rank in 0..world {
                let hint = candle_nn::var_builder::Shard {
                    dim,
                    rank,
                    world_size: world,
                };
                let len = w.dims()[dim];
                let (base, extra) = (len / world, len % world);
                let start = rank * base + rank.min(extra);
                let size = base + usize::from(rank < extra);
                let mut shape = w.dims().to_vec();
                shape[dim] = size;
                let part = vb
                    .get_with_hints(shape.as_slice(), "f32.matrix", hint)
                    .unwrap();
                let expected = w.narrow(dim, start, size).unwrap();
                assert_eq!(
                    bytes_of(&part),
                    bytes_of(&expected),
                    "{mode} dim {dim} {rank}/{world}"
                );
            }
        }
    }
}

#[test]
fn a_state_dict_goes_into_candle_whole() {
    let dir = tempdir().unwrap();
    let specs: Vec<Spec> = every_dtype()
        .into_iter()
        .filter(|s| {
            !matches!(
                s.dtype,
                Dtype::F8_E5M2 | Dtype::F8_E4M3FNUZ | Dtype::F8_E5M2FNUZ | Dtype::C64 | Dtype::U64
            )
        })
        .collect();
    let path = write_single(dir.path(), &specs);
    let sd = Loader::new().disable_mmap(true).load(&path).unwrap();
    let n = sd.len();
    let map = sd.into_candle(&Device::Cpu).unwrap();
    assert_eq!(map.len(), n);
    let f = map.get("f32.matrix").unwrap();
    assert_eq!(f.dims(), [4, 6]);
}

/// The one line where a safeload error meets candle's `?` (no `From` between them: the
/// orphan rule forbids it outside the crate of `safeload::Error`): wrapped, its message intact.
#[test]
fn safeload_errors_pass_through_candle() {
    fn open(path: &std::path::Path) -> candle_core::Result<Checkpoint> {
        Checkpoint::open(path).map_err(candle_core::Error::wrap)
    }
    let err = open(std::path::Path::new("/no/such/checkpoint")).unwrap_err();
    assert!(err.to_string().contains("/no/such/checkpoint"), "{err}");
}

/// The var builders take a remote address as they take a path (features `candle` and
/// `remote`): tensors equal to a local load's.
#[cfg(feature = "remote")]
#[test]
fn var_builders_read_a_remote_checkpoint() {
    let dir = tempdir().unwrap();
    let index = write_sharded(dir.path(), &every_dtype(), 2);
    let server =
        safeload_testhttp::Server::start(dir.path(), safeload_testhttp::Options::default())
            .unwrap();
    let url = format!("{}/", server.url());
    let dev = Device::Cpu;
    let local = safeload::candle::var_builder(&index, DType::F32, &dev).unwrap();
    let remote = safeload::candle::var_builder(&url, DType::F32, &dev).unwrap();
    for name in ["f32.matrix", "bf16.matrix", "f16.matrix"] {
        let a = local.get((4, 6), name).unwrap();
        let b = remote.get((4, 6), name).unwrap();
        assert_eq!(bytes_of(&a), bytes_of(&b), "{name}");
    }
    let opened = safeload::Checkpoint::open(&url).unwrap();
    let sharded = safeload::candle::sharded_var_builder_from(opened, DType::F32, &dev);
    let hint = candle_nn::var_builder::Shard {
        dim: 0,
        rank: 1,
        world_size: 2,
    };
    let part = sharded.get_with_hints((2, 6), "f32.matrix", hint).unwrap();
    let whole = local.get((4, 6), "f32.matrix").unwrap();
    assert_eq!(bytes_of(&part), bytes_of(&whole.narrow(0, 2, 2).unwrap()));
}
