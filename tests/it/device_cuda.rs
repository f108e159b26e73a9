//! Weights to a real GPU (feature `cuda`): every byte copied back and compared, whole, a
//! rank's part and converted. Reports itself skipped with a line where this machine has no
//! CUDA driver or device, unless `SAFELOAD_REQUIRE_CUDA=1`.

use std::sync::Arc;

use safeload::Dtype;
use safeload::device::{Cuda, DeviceTensor, LoadToDevice, Part, ToDevice};

use crate::common::{read_modes, spec, write_sharded};

/// The GPU, or `None` (and a line saying so) where there is none here.
fn gpu() -> Option<Cuda> {
    match Cuda::on_device(0) {
        Ok(gpu) => Some(gpu),
        Err(e) if std::env::var("SAFELOAD_REQUIRE_CUDA").as_deref() == Ok("1") => {
            panic!("SAFELOAD_REQUIRE_CUDA=1 and no CUDA device: {e}")
        }
        Err(e) => {
            eprintln!("device_cuda: SKIPPED (no CUDA device here: {e})");
            None
        }
    }
}

/// `t`'s bytes, copied back from the GPU.
fn to_host(gpu: &Cuda, t: &DeviceTensor<Cuda>) -> Vec<u8> {
    let memory = t.slab().memory();
    let view = memory.slice(t.offset()..t.offset() + t.nbytes());
    let bytes = gpu.stream().clone_dtoh(&view).unwrap();
    gpu.stream().synchronize().unwrap();
    bytes
}

#[test]
fn every_byte_reaches_the_gpu() {
    let Some(gpu) = gpu() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let specs = [
        spec("a", Dtype::BF16, &[1000, 3000]),
        spec("b", Dtype::F32, &[7, 5]),
        spec("c", Dtype::U8, &[5_000_001]),
    ];
    let index = write_sharded(dir.path(), &specs, 2);
    for (mode, loader) in read_modes() {
        let loader = loader.staging(3, 1 << 20);
        let loaded = loader.load_to_device(&index, &gpu).unwrap();
        for want in &specs {
            let t = loaded.get(&want.name).unwrap();
            assert!(
                to_host(&gpu, t) == want.data,
                "{mode}: {} differs",
                want.name
            );
        }
        let ck = loader.dtype(Dtype::F32).open(&index).unwrap();
        let part = ck
            .to_device_parts(&gpu, |t| match t.name() {
                "a" => Part::Shard {
                    dim: 1,
                    rank: 1,
                    world: 2,
                },
                _ => Part::Whole,
            })
            .unwrap();
        let a = part.get("a").unwrap();
        assert_eq!((a.dtype(), a.shape()), (Dtype::F32, &[1000, 1500][..]));
        let got = to_host(&gpu, a);
        let want: Vec<u8> = specs[0]
            .data
            .chunks_exact(6000)
            .flat_map(|row| row[3000..].chunks_exact(2))
            .flat_map(|v| {
                half::bf16::from_le_bytes([v[0], v[1]])
                    .to_f32()
                    .to_le_bytes()
            })
            .collect();
        assert!(got == want, "{mode}: the converted shard differs");
        drop(Arc::clone(a.slab()));
    }
}
