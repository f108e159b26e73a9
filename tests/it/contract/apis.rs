//! Every public way to get a tensor's bytes, each checked against the reference: the
//! `safetensors` crate's bytes, or the naive slice or conversion of them, and a length of
//! exactly `nbytes`.

use std::fmt::Display;
use std::path::Path;

use safeload::report::LoadReport;
use safeload::{Dtype, Loader, StateDict, Tensor};

use super::case::*;
use crate::common::Spec;

/// One source's checkpoint as the APIs see it.
pub struct Ctx<'a> {
    /// Where to load it from: a path or an address.
    pub address: &'a str,
    /// The loader of the source's mode.
    pub loader: fn() -> Loader,
    /// What the files hold.
    pub reference: &'a Reference,
    /// The seed of the APIs' random picks.
    pub seed: u64,
    /// What a whole load's report must say of the source (that it is what it is named).
    pub expect: fn(&LoadReport) -> Result<(), String>,
    /// A cache emptied before each API, so that each misses it.
    pub fresh_cache: Option<&'a Path>,
    /// With `fresh_cache`: the checkpoint whose files are then put in the cache as an
    /// interrupted load leaves them (partial files, every other piece kept), so that each
    /// API resumes them (read only by the sources of feature `remote`).
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    pub plant_from: Option<(&'a Path, usize)>,
}

/// What went wrong, a line each: the API, the tensor, what.
#[derive(Default)]
pub struct Failures(pub Vec<String>);

impl Failures {
    fn check(&mut self, api: &str, what: impl Display, result: Result<(), String>) {
        if let Err(e) = result {
            self.0.push(format!("{api}: {what}: {e}"));
        }
    }
}

/// One way to get bytes, checked over a source's checkpoint.
type Api = fn(&Ctx, &mut Failures);

/// The APIs, by name.
pub const APIS: &[(&str, Api)] = &[
    ("Loader::load", load),
    ("load_state_dict", load_state_dict),
    ("Loader::load_async", load_async),
    ("Loader::dtype", convert_on_load),
    ("Checkpoint::read", read),
    ("Checkpoint::read_into", read_into),
    ("Checkpoint::read_slice", read_slice),
    ("Checkpoint::shard", shard),
    ("Checkpoint::for_each", stream),
    ("Checkpoint::to_device", to_device::whole),
    ("Checkpoint::to_device_parts", to_device::parts),
    ("Loader::load_to_device, converted", to_device::converted),
    #[cfg(feature = "candle")]
    ("Tensor::to_candle", candle::to_candle),
    #[cfg(feature = "candle")]
    ("StateDict::into_candle", candle::into_candle),
    #[cfg(feature = "candle")]
    ("candle::var_builder_from", candle::var_builder),
    #[cfg(feature = "candle")]
    (
        "candle::sharded_var_builder_from",
        candle::sharded_var_builder,
    ),
];

/// Runs every API on `ctx`; the failures, a line each.
pub fn check_all(ctx: &Ctx) -> Vec<String> {
    let mut failures = Failures::default();
    for (name, api) in APIS {
        if let Some(cache) = ctx.fresh_cache {
            empty(cache);
            #[cfg(feature = "remote")]
            if let Some((dir, every)) = ctx.plant_from {
                super::sources::plant_partials(cache, dir, every);
            }
        }
        let before = failures.0.len();
        api(ctx, &mut failures);
        if failures.0.len() > before + 8 {
            // The first few say it; the rest would bury the other APIs' lines.
            let more = failures.0.len() - before - 8;
            failures.0.truncate(before + 8);
            failures.0.push(format!("{name}: ... and {more} more"));
        }
    }
    failures.0
}

fn empty(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
        }
    }
}

/// The tensor is `want`: name, dtype, shape, `nbytes`, and exactly its bytes.
pub fn exact(t: &Tensor, want: &Spec) -> Result<(), String> {
    if (t.name(), t.dtype(), t.shape()) != (want.name.as_str(), want.dtype, &want.shape[..]) {
        return Err(format!(
            "{} {:?} {:?} where {} {:?} {:?} is",
            t.name(),
            t.dtype(),
            t.shape(),
            want.name,
            want.dtype,
            want.shape
        ));
    }
    same_bytes(t, &want.data)
}

/// `as_bytes()` is `want`, and as long as `nbytes()` says.
fn same_bytes(t: &Tensor, want: &[u8]) -> Result<(), String> {
    let got = t.as_bytes();
    if got.len() as u64 != t.nbytes() || got.len() != want.len() {
        return Err(format!(
            "as_bytes() is {} bytes, nbytes() {}, where the tensor is {}",
            got.len(),
            t.nbytes(),
            want.len()
        ));
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        Some(at) => Err(format!("byte {at} differs")),
        None => Ok(()),
    }
}

/// The typed view of the tensor's dtype and `to_f32` give the reference's values.
pub fn views(t: &Tensor, want: &Spec) -> Result<(), String> {
    fn view<T: safeload::Element>(t: &Tensor, want: &[u8]) -> Result<(), String> {
        let slice = t.as_slice::<T>().map_err(|e| format!("as_slice: {e}"))?;
        if bytemuck::cast_slice::<T, u8>(slice) != want {
            return Err(format!(
                "as_slice: {} elements differ from the bytes",
                slice.len()
            ));
        }
        Ok(())
    }
    let data = &want.data;
    match want.dtype {
        Dtype::U8 => view::<u8>(t, data),
        Dtype::I8 => view::<i8>(t, data),
        Dtype::U16 => view::<u16>(t, data),
        Dtype::I16 => view::<i16>(t, data),
        Dtype::U32 => view::<u32>(t, data),
        Dtype::I32 => view::<i32>(t, data),
        Dtype::U64 => view::<u64>(t, data),
        Dtype::I64 => view::<i64>(t, data),
        Dtype::F16 => view::<half::f16>(t, data),
        Dtype::BF16 => view::<half::bf16>(t, data),
        Dtype::F32 => view::<f32>(t, data),
        Dtype::F64 => view::<f64>(t, data),
        _ => Ok(()),
    }?;
    let reads_f32 = matches!(
        want.dtype,
        Dtype::F32 | Dtype::F64 | Dtype::F16 | Dtype::BF16
    );
    match (t.to_f32(), reads_f32) {
        (Ok(got), true) => same_f32(&got, &naive_f32(want.dtype, data).unwrap())
            .map_err(|e| format!("to_f32: {e}")),
        (Err(e), true) => Err(format!("to_f32: {e}")),
        (Ok(got), false) => Err(format!(
            "to_f32 of {:?} gave {} values",
            want.dtype,
            got.len()
        )),
        (Err(_), false) => Ok(()),
    }
}

/// Every tensor of the reference is in `sd`, and nothing else, each exact with its views.
fn whole(api: &str, sd: &StateDict, reference: &Reference, failures: &mut Failures) {
    failures.check(api, "tensor count", {
        let (got, want) = (sd.len(), reference.tensors.len());
        if got == want {
            Ok(())
        } else {
            Err(format!("{got} where {want}"))
        }
    });
    for (name, want) in &reference.tensors {
        let result = match sd.get(name) {
            Some(t) => exact(t, want).and_then(|()| views(t, want)),
            None => Err("missing".to_owned()),
        };
        failures.check(api, name, result);
    }
}

/// The conversion target of this seed: F16, BF16 or F32.
fn target(seed: u64) -> Dtype {
    [Dtype::F16, Dtype::BF16, Dtype::F32][(seed % 3) as usize]
}

fn load(ctx: &Ctx, failures: &mut Failures) {
    let api = "Loader::load";
    match (ctx.loader)().load(ctx.address) {
        Ok(sd) => {
            failures.check(api, "the source's report", (ctx.expect)(sd.report()));
            whole(api, &sd, ctx.reference, failures);
        }
        Err(e) => failures.check(api, "the load", Err(e.to_string())),
    }
}

fn load_state_dict(ctx: &Ctx, failures: &mut Failures) {
    let api = "load_state_dict";
    match safeload::load_state_dict(ctx.address, None) {
        Ok(sd) => whole(api, &sd, ctx.reference, failures),
        Err(e) => failures.check(api, "the load", Err(e.to_string())),
    }
}

fn load_async(ctx: &Ctx, failures: &mut Failures) {
    let api = "Loader::load_async";
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    match runtime.block_on((ctx.loader)().load_async(ctx.address)) {
        Ok(sd) => whole(api, &sd, ctx.reference, failures),
        Err(e) => failures.check(api, "the load", Err(e.to_string())),
    }
}

/// A converted tensor is `to`'s naive conversion of the reference; a tensor the
/// conversion leaves is exactly the reference.
fn converted(t: &Tensor, want: &Spec, to: Dtype) -> Result<(), String> {
    let Some(bytes) = naive_convert(want.dtype, to, &want.data) else {
        return exact(t, want);
    };
    if (t.dtype(), t.shape()) != (to, &want.shape[..]) {
        return Err(format!(
            "{:?} {:?} where {to:?} {:?} is",
            t.dtype(),
            t.shape(),
            want.shape
        ));
    }
    let got = t.as_bytes();
    if got.len() as u64 != t.nbytes() {
        return Err(format!(
            "as_bytes() is {} bytes, nbytes() {}",
            got.len(),
            t.nbytes()
        ));
    }
    same_floats(to, got, &bytes)
}

fn convert_on_load(ctx: &Ctx, failures: &mut Failures) {
    let api = "Loader::dtype";
    let to = target(ctx.seed);
    let sd = match (ctx.loader)().dtype(to).load(ctx.address) {
        Ok(sd) => sd,
        Err(e) => return failures.check(api, "the load", Err(e.to_string())),
    };
    for (name, want) in &ctx.reference.tensors {
        let result = match sd.get(name) {
            Some(t) => converted(t, want, to),
            None => Err("missing".to_owned()),
        };
        failures.check(api, format!("{name} to {to:?}"), result);
    }
}

/// The checkpoint opened with the source's loader, and the reference's tensors in a
/// random order.
fn open<'a>(
    ctx: &'a Ctx,
    api: &str,
    failures: &mut Failures,
) -> Option<(safeload::Checkpoint, Vec<&'a Spec>)> {
    match (ctx.loader)().open(ctx.address) {
        Ok(ck) => {
            let all: Vec<&Spec> = ctx.reference.tensors.values().collect();
            Some((ck, Picks::new(ctx.seed).shuffled(&all)))
        }
        Err(e) => {
            failures.check(api, "the open", Err(e.to_string()));
            None
        }
    }
}

fn read(ctx: &Ctx, failures: &mut Failures) {
    let api = "Checkpoint::read";
    let Some((ck, order)) = open(ctx, api, failures) else {
        return;
    };
    let to = target(ctx.seed);
    for want in order {
        let result = ck
            .read(&want.name)
            .map_err(|e| e.to_string())
            .and_then(|t| {
                exact(&t, want)?;
                views(&t, want)?;
                // Tensor::to_dtype: the naive conversion where the pair converts, a clone
                // where the dtype is already `to`, an error otherwise.
                match t.to_dtype(to) {
                    Ok(c) if want.dtype == to => exact(&c, want),
                    Ok(c) => converted(&c, want, to).map_err(|e| format!("to_dtype({to:?}): {e}")),
                    Err(e) if naive_convert(want.dtype, to, &want.data).is_some() => {
                        Err(format!("to_dtype({to:?}): {e}"))
                    }
                    Err(_) => Ok(()),
                }
            });
        failures.check(api, &want.name, result);
    }
}

fn read_into(ctx: &Ctx, failures: &mut Failures) {
    let api = "Checkpoint::read_into";
    let Some((ck, order)) = open(ctx, api, failures) else {
        return;
    };
    for want in order {
        let mut dst = vec![0xa5u8; want.data.len()];
        let mut result = ck
            .read_into(&want.name, &mut dst)
            .map_err(|e| e.to_string());
        if result.is_ok() && dst != want.data {
            let at = dst.iter().zip(&want.data).position(|(a, b)| a != b);
            result = Err(format!("byte {at:?} differs"));
        }
        // A buffer one byte longer is refused, not filled in part.
        let mut longer = vec![0u8; want.data.len() + 1];
        if result.is_ok() && ck.read_into(&want.name, &mut longer).is_ok() {
            result = Err("a buffer one byte too long was taken".to_owned());
        }
        failures.check(api, &want.name, result);
    }
}

/// The slice of `want` at `ranges`, against the naive twin.
fn sliced(t: &Tensor, want: &Spec, ranges: &[std::ops::Range<usize>]) -> Result<(), String> {
    let shape: Vec<usize> = ranges
        .iter()
        .map(|r| r.len())
        .chain(want.shape[ranges.len()..].iter().copied())
        .collect();
    if t.shape() != shape.as_slice() || t.dtype() != want.dtype {
        return Err(format!(
            "{:?} {:?} where {:?} {shape:?} is",
            t.dtype(),
            t.shape(),
            want.dtype
        ));
    }
    same_bytes(t, &naive_slice(want, ranges).unwrap())
}

fn read_slice(ctx: &Ctx, failures: &mut Failures) {
    let api = "Checkpoint::read_slice";
    let Some((ck, order)) = open(ctx, api, failures) else {
        return;
    };
    let mut picks = Picks::new(ctx.seed ^ 0x51ce);
    for want in order {
        let whole = ck.read_slice(&want.name, &[]).map_err(|e| e.to_string());
        failures.check(
            api,
            format!("{} whole", want.name),
            whole.and_then(|t| exact(&t, want)),
        );
        // A random block over the leading dimensions (sub-byte dtypes: whole only, a cut
        // inside a byte being an error by design).
        if want.shape.is_empty() || want.dtype.bitsize() % 8 != 0 {
            continue;
        }
        let dims = 1 + picks.below(want.shape.len());
        let ranges: Vec<_> = want.shape[..dims].iter().map(|&d| picks.range(d)).collect();
        let result = ck
            .read_slice(&want.name, &ranges)
            .map_err(|e| e.to_string())
            .and_then(|t| sliced(&t, want, &ranges));
        failures.check(api, format!("{} {ranges:?}", want.name), result);
    }
}

fn shard(ctx: &Ctx, failures: &mut Failures) {
    let api = "Checkpoint::shard";
    let Some((ck, order)) = open(ctx, api, failures) else {
        return;
    };
    let mut picks = Picks::new(ctx.seed ^ 0x5a4d);
    for want in order {
        if want.shape.is_empty() || want.dtype.bitsize() % 8 != 0 {
            continue;
        }
        let dim = picks.below(want.shape.len());
        let world = 1 + picks.below(5);
        let rank = picks.below(world);
        let ranges = naive_shard(&want.shape, dim, rank, world);
        let result = ck
            .shard(&want.name, dim, rank, world)
            .map_err(|e| e.to_string())
            .and_then(|t| sliced(&t, want, &ranges));
        failures.check(
            api,
            format!("{} dim {dim} rank {rank}/{world}", want.name),
            result,
        );
    }
}

fn stream(ctx: &Ctx, failures: &mut Failures) {
    let api = "Checkpoint::for_each";
    let Some((ck, _)) = open(ctx, api, failures) else {
        return;
    };
    let _streaming = crate::common::streaming();
    let mut seen = Vec::new();
    // A cap below most tensors: each is read alone, its lease given back as it drops.
    let result = ck.for_each(1 << 20, |t| {
        let result = match ctx.reference.tensors.get(t.name()) {
            Some(want) => exact(&t, want).and_then(|()| views(&t, want)),
            None => Err("not in the reference".to_owned()),
        };
        failures.check(api, t.name(), result);
        seen.push(t.name().to_owned());
        Ok::<(), safeload::Error>(())
    });
    failures.check(api, "the stream", result.map_err(|e| e.to_string()));
    seen.sort();
    let want: Vec<&String> = ctx.reference.tensors.keys().collect();
    let seen: Vec<&String> = seen.iter().collect();
    failures.check(
        api,
        "the tensors handed out",
        if seen == want {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        },
    );
}

mod to_device {
    //! To a device (the CPU stand-in), through a ring of 1 MiB buffers, so that the
    //! case's tensors span chunks and chunks hold several tensors: whole, in parts, and
    //! converted; every staging buffer given back.

    use safeload::device::{DeviceTensors, LoadToDevice, Part, StandIn, ToDevice};

    use super::*;

    /// A ring small enough that the case's 2-3 MiB tensors span chunks.
    fn ring(loader: Loader) -> Loader {
        loader.staging(3, 1 << 20)
    }

    /// The load's tensors against `want(name)`: bytes, dtype and shape; and nothing
    /// left of the ring.
    fn check(
        api: &str,
        loaded: safeload::Result<DeviceTensors<StandIn>>,
        device: &StandIn,
        failures: &mut Failures,
        mut want: impl FnMut(&str, &safeload::device::DeviceTensor<StandIn>) -> Result<(), String>,
    ) {
        let loaded = match loaded {
            Ok(loaded) => loaded,
            Err(e) => return failures.check(api, "the load", Err(e.to_string())),
        };
        for t in loaded.iter() {
            failures.check(api, t.name(), want(t.name(), t));
        }
        failures.check(
            api,
            "the ring",
            match device.live_staging() {
                0 => Ok(()),
                n => Err(format!("{n} staging buffers left")),
            },
        );
    }

    /// The device bytes of `t`, as `bytes` and the shape.
    fn same(
        t: &safeload::device::DeviceTensor<StandIn>,
        dtype: Dtype,
        shape: &[usize],
        bytes: &[u8],
    ) -> Result<(), String> {
        if (t.dtype(), t.shape()) != (dtype, shape) {
            return Err(format!(
                "{:?} {:?} where {dtype:?} {shape:?} is",
                t.dtype(),
                t.shape()
            ));
        }
        let got = t.to_host().ok_or("no bytes")?;
        if got.len() != t.nbytes() || got.len() != bytes.len() {
            return Err(format!("{} bytes where {} are", got.len(), bytes.len()));
        }
        match got.iter().zip(bytes).position(|(a, b)| a != b) {
            Some(at) => Err(format!("byte {at} differs")),
            None => Ok(()),
        }
    }

    pub fn whole(ctx: &Ctx, failures: &mut Failures) {
        let api = "Checkpoint::to_device";
        let device = StandIn::new();
        let loaded = ring((ctx.loader)())
            .open(ctx.address)
            .and_then(|ck| ck.to_device(&device));
        if let Ok(loaded) = &loaded {
            failures.check(
                api,
                "tensor count",
                match loaded.len() {
                    n if n == ctx.reference.tensors.len() => Ok(()),
                    n => Err(format!("{n} where {}", ctx.reference.tensors.len())),
                },
            );
        }
        check(api, loaded, &device, failures, |name, t| {
            let want = ctx
                .reference
                .tensors
                .get(name)
                .ok_or("not in the reference")?;
            same(t, want.dtype, &want.shape, &want.data)
        });
    }

    /// A random part of each tensor: a rank's part along a random dimension, a block,
    /// or the whole (sub-byte dtypes whole, a cut inside a byte being refused).
    pub fn parts(ctx: &Ctx, failures: &mut Failures) {
        let api = "Checkpoint::to_device_parts";
        let mut picks = Picks::new(ctx.seed ^ 0xde71);
        let parts: std::collections::BTreeMap<&str, Part> = ctx
            .reference
            .tensors
            .values()
            .map(|want| {
                let part = if want.shape.is_empty() || want.dtype.bitsize() % 8 != 0 {
                    Part::Whole
                } else if picks.below(2) == 0 {
                    let dim = picks.below(want.shape.len());
                    let world = 1 + picks.below(5);
                    let rank = picks.below(world);
                    Part::Shard { dim, rank, world }
                } else {
                    let dims = 1 + picks.below(want.shape.len());
                    Part::Slice(want.shape[..dims].iter().map(|&d| picks.range(d)).collect())
                };
                (want.name.as_str(), part)
            })
            .collect();
        let device = StandIn::new();
        let loaded = ring((ctx.loader)())
            .open(ctx.address)
            .and_then(|ck| ck.to_device_parts(&device, |info| parts[info.name()].clone()));
        check(api, loaded, &device, failures, |name, t| {
            let want = ctx
                .reference
                .tensors
                .get(name)
                .ok_or("not in the reference")?;
            let ranges = match &parts[name] {
                Part::Shard { dim, rank, world } => naive_shard(&want.shape, *dim, *rank, *world),
                Part::Slice(ranges) => ranges.clone(),
                _ => Vec::new(),
            };
            let shape: Vec<usize> = ranges
                .iter()
                .map(|r| r.len())
                .chain(want.shape[ranges.len()..].iter().copied())
                .collect();
            let bytes = match ranges.is_empty() {
                true => want.data.clone(),
                false => naive_slice(want, &ranges).ok_or("no naive slice")?,
            };
            same(t, want.dtype, &shape, &bytes).map_err(|e| format!("{:?}: {e}", parts[name]))
        });
    }

    pub fn converted(ctx: &Ctx, failures: &mut Failures) {
        let api = "Loader::load_to_device, converted";
        let to = target(ctx.seed);
        let device = StandIn::new();
        let loaded = ring((ctx.loader)().dtype(to)).load_to_device(ctx.address, &device);
        check(api, loaded, &device, failures, |name, t| {
            let want = ctx
                .reference
                .tensors
                .get(name)
                .ok_or("not in the reference")?;
            match naive_convert(want.dtype, to, &want.data) {
                None => same(t, want.dtype, &want.shape, &want.data),
                Some(bytes) => {
                    if (t.dtype(), t.shape()) != (to, &want.shape[..]) {
                        return Err(format!("{:?} {:?} where {to:?} is", t.dtype(), t.shape()));
                    }
                    same_floats(to, &t.to_host().ok_or("no bytes")?, &bytes)
                }
            }
        });
    }
}

#[cfg(feature = "candle")]
mod candle {
    //! The candle feature's ways: a tensor to candle, a whole state dict, and the two
    //! `VarBuilder`s.

    use candle_core::{DType, Device};
    use safeload::candle::{IntoCandle, ToCandle};

    use super::*;

    /// The candle tensor holds `want`'s values in the dtype the table of
    /// `safeload::candle::ToCandle` gives (`Ok(None)`: a dtype whose values this does not read
    /// back, checked by dtype and shape only).
    fn same(got: &candle_core::Tensor, want: &Spec) -> Result<(), String> {
        fn vec<T: candle_core::WithDType>(t: &candle_core::Tensor) -> Result<Vec<T>, String> {
            t.flatten_all()
                .and_then(|f| f.to_vec1::<T>())
                .map_err(|e| e.to_string())
        }
        if got.dims() != want.shape.as_slice() {
            return Err(format!("shape {:?} where {:?} is", got.dims(), want.shape));
        }
        let expected = candle_dtype(want.dtype).ok_or("a dtype candle has no room for")?;
        if got.dtype() != expected {
            return Err(format!("{:?} where {expected:?} is", got.dtype()));
        }
        let d = &want.data;
        let bytes: Vec<u8> = match want.dtype {
            Dtype::BOOL => {
                return equal(
                    vec::<u8>(got)?,
                    d.iter().map(|&b| u8::from(b != 0)).collect(),
                );
            }
            Dtype::I8 => {
                return equal(
                    vec::<i16>(got)?,
                    d.iter().map(|&b| i16::from(b as i8)).collect(),
                );
            }
            Dtype::U16 => {
                let wide = d
                    .chunks_exact(2)
                    .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])));
                return equal(vec::<u32>(got)?, wide.collect());
            }
            Dtype::U64 | Dtype::I64 => bytemuck::cast_slice(&vec::<i64>(got)?).to_vec(),
            Dtype::U8 => vec::<u8>(got)?,
            Dtype::I16 => bytemuck::cast_slice(&vec::<i16>(got)?).to_vec(),
            Dtype::U32 => bytemuck::cast_slice(&vec::<u32>(got)?).to_vec(),
            Dtype::I32 => bytemuck::cast_slice(&vec::<i32>(got)?).to_vec(),
            Dtype::F16 => bytemuck::cast_slice(&vec::<half::f16>(got)?).to_vec(),
            Dtype::BF16 => bytemuck::cast_slice(&vec::<half::bf16>(got)?).to_vec(),
            Dtype::F32 => bytemuck::cast_slice(&vec::<f32>(got)?).to_vec(),
            Dtype::F64 => bytemuck::cast_slice(&vec::<f64>(got)?).to_vec(),
            _ => return Ok(()),
        };
        if &bytes == d {
            Ok(())
        } else {
            Err("values differ".to_owned())
        }
    }

    fn equal<T: PartialEq>(got: Vec<T>, want: Vec<T>) -> Result<(), String> {
        if got == want {
            Ok(())
        } else {
            Err("values differ".to_owned())
        }
    }

    /// The candle dtype a dtype loads as: the crate docs' table, written
    /// out here so that the contract does not take it from the crate.
    fn candle_dtype(dtype: Dtype) -> Option<DType> {
        Some(match dtype {
            Dtype::BOOL | Dtype::U8 => DType::U8,
            Dtype::I8 | Dtype::I16 => DType::I16,
            Dtype::U16 | Dtype::U32 => DType::U32,
            Dtype::I32 => DType::I32,
            Dtype::I64 | Dtype::U64 => DType::I64,
            Dtype::F16 => DType::F16,
            Dtype::BF16 => DType::BF16,
            Dtype::F32 => DType::F32,
            Dtype::F64 => DType::F64,
            Dtype::F8_E4M3 => DType::F8E4M3,
            Dtype::F8_E8M0 => DType::F8E8M0,
            Dtype::F4 => DType::F4,
            Dtype::F6_E2M3 => DType::F6E2M3,
            Dtype::F6_E3M2 => DType::F6E3M2,
            _ => return None,
        })
    }

    /// Whether `to_candle` of `want` is to fail: a dtype candle has no room for, or a U64
    /// beyond I64.
    fn refused(want: &Spec) -> bool {
        candle_dtype(want.dtype).is_none()
            || (want.dtype == Dtype::U64 && want.data.chunks_exact(8).any(|c| c[7] & 0x80 != 0))
    }

    fn check(got: candle_core::Result<candle_core::Tensor>, want: &Spec) -> Result<(), String> {
        match (got, refused(want)) {
            (Ok(t), false) => same(&t, want),
            (Err(e), false) => Err(e.to_string()),
            (Ok(_), true) => Err("converted where candle has no room for it".to_owned()),
            (Err(_), true) => Ok(()),
        }
    }

    pub fn to_candle(ctx: &Ctx, failures: &mut Failures) {
        let api = "Tensor::to_candle";
        let Some((ck, order)) = open(ctx, api, failures) else {
            return;
        };
        for want in order {
            let result = ck
                .read(&want.name)
                .map_err(|e| e.to_string())
                .and_then(|t| check(t.to_candle(&Device::Cpu), want));
            failures.check(api, &want.name, result);
        }
    }

    pub fn into_candle(ctx: &Ctx, failures: &mut Failures) {
        let api = "StateDict::into_candle";
        let sd = match (ctx.loader)().load(ctx.address) {
            Ok(sd) => sd,
            Err(e) => return failures.check(api, "the load", Err(e.to_string())),
        };
        let any_refused = ctx.reference.tensors.values().any(refused);
        match (sd.into_candle(&Device::Cpu), any_refused) {
            (Ok(map), false) => {
                for (name, want) in &ctx.reference.tensors {
                    let result = match map.get(name) {
                        Some(t) => same(t, want),
                        None => Err("missing".to_owned()),
                    };
                    failures.check(api, name, result);
                }
            }
            (Err(e), false) => failures.check(api, "the conversion", Err(e.to_string())),
            (Ok(_), true) => failures.check(
                api,
                "the conversion",
                Err("took a tensor candle has no room for".to_owned()),
            ),
            (Err(_), true) => {}
        }
    }

    /// Float tensors asked for as F32 (safeload's conversion or a straight read),
    /// the others in their own candle dtype.
    pub fn var_builder(ctx: &Ctx, failures: &mut Failures) {
        let api = "candle::var_builder_from";
        let Some((ck, order)) = open(ctx, api, failures) else {
            return;
        };
        for want in order {
            let result = if let Some(values) = naive_f32(want.dtype, &want.data) {
                let vb = safeload::candle::var_builder_from(ck.clone(), DType::F32, &Device::Cpu);
                vb.get(want.shape.as_slice(), &want.name)
                    .and_then(|t| t.flatten_all()?.to_vec1::<f32>())
                    .map_err(|e| e.to_string())
                    .and_then(|got| same_f32(&got, &values))
            } else if let Some(dtype) = candle_dtype(want.dtype) {
                let vb = safeload::candle::var_builder_from(ck.clone(), dtype, &Device::Cpu);
                check(vb.get(want.shape.as_slice(), &want.name), want)
            } else {
                Ok(())
            };
            failures.check(api, &want.name, result);
        }
    }

    /// Rank parts along dimension 0 of the float tensors, as F32.
    pub fn sharded_var_builder(ctx: &Ctx, failures: &mut Failures) {
        let api = "candle::sharded_var_builder_from";
        let Some((ck, order)) = open(ctx, api, failures) else {
            return;
        };
        let vb = safeload::candle::sharded_var_builder_from(ck, DType::F32, &Device::Cpu);
        let mut picks = Picks::new(ctx.seed ^ 0xca4d);
        for want in order {
            let Some(_) = naive_f32(want.dtype, &want.data) else {
                continue;
            };
            if want.shape.is_empty() {
                continue;
            }
            let world = 2 + picks.below(3);
            let rank = picks.below(world);
            let ranges = naive_shard(&want.shape, 0, rank, world);
            let part = naive_slice(want, &ranges).unwrap();
            let values = naive_f32(want.dtype, &part).unwrap();
            let mut shape = want.shape.clone();
            shape[0] = ranges[0].len();
            let hint = candle_nn::var_builder::Shard {
                dim: 0,
                rank,
                world_size: world,
            };
            let result = vb
                .get_with_hints(shape.as_slice(), &want.name, hint)
                .and_then(|t| t.flatten_all()?.to_vec1::<f32>())
                .map_err(|e| e.to_string())
                .and_then(|got| same_f32(&got, &values));
            failures.check(api, format!("{} rank {rank}/{world}", want.name), result);
        }
    }
}
