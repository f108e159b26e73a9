//! A load to a real GPU as candle tensors on `Device::Cuda` (feature `candle-cuda`): every
//! byte copied back through candle and compared; a file's main dtype as views of its slab, the
//! others as copies; a `VarBuilder` over them. Reports itself skipped with a line where this
//! machine has no CUDA device, unless `SAFELOAD_REQUIRE_CUDA=1`. (With candle's `cuda` the
//! binary links CUDA's libraries: it starts only where they are, as under any candle build
//! with `cuda`.)

use candle_core::cuda::cudarc::driver::DevicePtr;
use candle_core::{DType, Device, Storage, Tensor};
use safeload::Dtype;
use safeload::candle::IntoCandle;
use safeload::device::{Cuda, LoadToDevice};

use crate::common::{Spec, spec, write_sharded, write_single};

/// candle's GPU, or `None` (and a line saying so) where there is none here.
fn gpu() -> Option<Device> {
    // candle's error carries a backtrace where RUST_BACKTRACE is set: its first line says it.
    let error = match Device::new_cuda(0) {
        Ok(device) => return Some(device),
        Err(e) => e.to_string(),
    };
    let e = error.lines().next().unwrap_or_default();
    if std::env::var("SAFELOAD_REQUIRE_CUDA").as_deref() == Ok("1") {
        panic!("SAFELOAD_REQUIRE_CUDA=1 and no CUDA device: {e}")
    }
    eprintln!("candle_cuda: SKIPPED (no CUDA device here: {e})");
    None
}

/// `t`'s bytes, copied back to the host through candle.
fn bytes(t: &Tensor) -> Vec<u8> {
    let t = t.flatten_all().unwrap();
    match t.dtype() {
        DType::U8 => t.to_vec1::<u8>().unwrap(),
        DType::I64 => bytemuck::cast_slice(&t.to_vec1::<i64>().unwrap()).to_vec(),
        DType::F32 => bytemuck::cast_slice(&t.to_vec1::<f32>().unwrap()).to_vec(),
        DType::BF16 => bytemuck::cast_slice(&t.to_vec1::<half::bf16>().unwrap()).to_vec(),
        other => panic!("no bytes of {other:?} in this test"),
    }
}

/// The device address of `t`'s first element: its storage's, plus its
/// layout's offset.
fn address(t: &Tensor) -> u64 {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(storage) = &*storage else {
        panic!("{t:?} is not on the GPU")
    };
    let stream = storage.device.cuda_stream();
    let base = match t.dtype() {
        DType::U8 => storage.as_cuda_slice::<u8>().unwrap().device_ptr(&stream).0,
        DType::I64 => {
            storage
                .as_cuda_slice::<i64>()
                .unwrap()
                .device_ptr(&stream)
                .0
        }
        DType::F32 => {
            storage
                .as_cuda_slice::<f32>()
                .unwrap()
                .device_ptr(&stream)
                .0
        }
        DType::BF16 => {
            storage
                .as_cuda_slice::<half::bf16>()
                .unwrap()
                .device_ptr(&stream)
                .0
        }
        other => panic!("no address of {other:?} in this test"),
    };
    base + (layout.start_offset() * t.dtype().size_in_bytes()) as u64
}

/// Two files of mostly BF16 tensors, with an F32 norm, an I64 buffer and a
/// BOOL mask beside them, and an empty tensor.
fn specs() -> Vec<Spec> {
    vec![
        spec("embed", Dtype::BF16, &[300, 64]),
        spec("up", Dtype::BF16, &[64, 96]),
        spec("down", Dtype::BF16, &[96, 64]),
        spec("norm", Dtype::F32, &[64]),
        spec("positions", Dtype::I64, &[17]),
        spec("mask", Dtype::BOOL, &[5, 3]),
        spec("bias", Dtype::BF16, &[96]),
        spec("empty", Dtype::BF16, &[0, 64]),
    ]
}

#[test]
fn main_dtype_views_the_slab_and_every_byte_arrives() {
    let Some(device) = gpu() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let specs = specs();
    let index = write_sharded(dir.path(), &specs, 2);
    let gpu: Cuda = safeload::candle::cuda::device(&device).unwrap();
    let loaded = safeload::Loader::new()
        .staging(3, 64 << 10)
        .load_to_device(&index, &gpu)
        .unwrap();
    let before: Vec<(String, u64)> = loaded
        .iter()
        .map(|t| (t.name().to_string(), t.device_ptr()))
        .collect();
    let tensors = loaded.into_candle(&device).unwrap();
    assert_eq!(tensors.len(), specs.len());
    for want in &specs {
        let t = &tensors[&want.name];
        assert_eq!(t.dims(), want.shape.as_slice(), "{}", want.name);
        assert!(bytes(t) == want.data, "{} differs", want.name);
        if want.data.is_empty() {
            continue;
        }
        // BF16 holds most of each file's bytes: its tensors are the slab
        // itself, where the load put them; the others were copied out of it.
        let loaded_at = before.iter().find(|(n, _)| *n == want.name).unwrap().1;
        let main = want.dtype == Dtype::BF16;
        assert_eq!(
            address(t) == loaded_at,
            main,
            "{}: a view of the slab is {main}",
            want.name
        );
    }
    assert_eq!(tensors["mask"].dtype(), DType::U8);
    // candle's kernels read a view where it lies: columns 3..13 of the
    // embedding, gathered on the GPU.
    let part = tensors["embed"]
        .narrow(1, 3, 10)
        .unwrap()
        .contiguous()
        .unwrap();
    let want: Vec<u8> = specs[0]
        .data
        .chunks_exact(128)
        .flat_map(|row| row[6..26].to_vec())
        .collect();
    assert!(bytes(&part) == want, "the gathered columns differ");
}

#[test]
fn a_held_tensor_makes_its_file_a_copy() {
    let Some(device) = gpu() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let specs = vec![
        spec("w", Dtype::BF16, &[128, 64]),
        spec("v", Dtype::BF16, &[64]),
    ];
    let path = write_single(dir.path(), &specs);
    let gpu = safeload::candle::cuda::device(&device).unwrap();
    let loaded = safeload::Loader::new().load_to_device(&path, &gpu).unwrap();
    let held = loaded.get("w").unwrap().clone();
    let tensors = loaded.into_candle(&device).unwrap();
    for want in &specs {
        let t = &tensors[&want.name];
        assert!(bytes(t) == want.data, "{} differs", want.name);
    }
    assert_ne!(
        address(&tensors["w"]),
        held.device_ptr(),
        "a copy, not the held slab"
    );
}

#[test]
fn a_var_builder_over_the_gpu_tensors() {
    let Some(device) = gpu() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let specs = vec![
        spec("layer.weight", Dtype::F32, &[8, 16]),
        spec("layer.bias", Dtype::F32, &[8]),
    ];
    let path = write_single(dir.path(), &specs);
    let vb = safeload::candle::cuda::var_builder(&path, DType::F32, &device).unwrap();
    let w = vb.pp("layer").get((8, 16), "weight").unwrap();
    assert!(w.device().same_device(&device));
    assert!(bytes(&w) == specs[0].data);
    assert!(
        vb.get((8, 16), "layer.bias").is_err(),
        "the wrong shape is refused"
    );
    // Converted in the staging buffers on the way: F32 to BF16.
    let loaded = safeload::Loader::new()
        .dtype(Dtype::BF16)
        .load_to_device(&path, &safeload::candle::cuda::device(&device).unwrap())
        .unwrap();
    let vb = safeload::candle::cuda::var_builder_from(loaded, DType::BF16, &device).unwrap();
    let b = vb.get(8, "layer.bias").unwrap();
    assert_eq!(b.dtype(), DType::BF16);
    let want: Vec<half::bf16> = specs[1]
        .data
        .chunks_exact(4)
        .map(|v| half::bf16::from_f32(f32::from_le_bytes([v[0], v[1], v[2], v[3]])))
        .collect();
    let got = b.to_vec1::<half::bf16>().unwrap();
    assert!(
        got.iter()
            .zip(&want)
            .all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan())),
        "the converted bias differs"
    );
}

#[test]
fn a_dtype_candle_lacks_is_an_error_naming_the_tensor() {
    let Some(device) = gpu() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let specs = vec![
        spec("w", Dtype::BF16, &[16, 16]),
        spec("codes", Dtype::I8, &[16]),
    ];
    let path = write_single(dir.path(), &specs);
    let gpu = safeload::candle::cuda::device(&device).unwrap();
    let loaded = safeload::Loader::new().load_to_device(&path, &gpu).unwrap();
    let error = loaded.into_candle(&device).unwrap_err().to_string();
    assert!(error.contains("\"codes\""), "{error}");
}
