#!/usr/bin/env bash
# Builds, lints and documents the `candle-cuda` glue (the candle crate's feature `cuda`,
# crates/candle/src/cuda.rs; tests/it/candle_cuda.rs), and runs its tests where there is a GPU. Not part of .ci/run:
# candle's own `cuda` compiles its kernels with `nvcc` (candle-kernels' build script), which
# alone took 6 to 9.5 minutes on this project's two cores, once for clippy, once for doc and
# once for the tests (README, "Weights straight to a GPU").
#
# With no `nvcc` on PATH, NVIDIA's CUDA 13.0 wheels from PyPI give one, with its headers and
# `cudart`, under .cuda-wheels/ (ignored by git; about 270 MiB). Linking the test binary needs
# CUDA's libraries too (libcuda from the driver, cuBLAS, cuRAND, NVRTC), as any candle build with
# `cuda` does: on a machine with a GPU and no toolkit, the script adds their wheels.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvcc >/dev/null 2>&1; then
  wheels="$PWD/.cuda-wheels"
  if [ ! -x "$wheels/nvidia/cu13/bin/nvcc" ]; then
    pip install --quiet --no-deps --target "$wheels" \
      nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
      nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85
  fi
  export CUDA_ROOT="$wheels/nvidia/cu13"
  export PATH="$CUDA_ROOT/bin:$PATH"
fi
# Where no GPU is there to ask, candle's kernels are built for compute capability 9.0 (H100, H200).
if ! nvidia-smi >/dev/null 2>&1; then
  export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
fi
# cudarc's bindings follow nvcc's version, not the 12.2 that .ci/run names for a build without nvcc.
unset CUDARC_CUDA_VERSION
# `remote` too: without it the crate's remote-only error helpers are dead code to clippy.
features=candle-cuda,remote

start=$SECONDS
# The facade (its tests) and the candle crate, its `cuda` turned on by the facade's
# `candle-cuda` (one build: the features unify), as .ci/run lints them with the other features.
cargo clippy -p safeload -p safeload-candle --all-targets --features "$features" -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -p safeload -p safeload-candle --features "$features" --quiet
python3 scripts/check_docs.py target/doc/safeload crates examples
echo "candle-cuda: built, linted and documented in $((SECONDS - start)) s"

if [ "${SAFELOAD_REQUIRE_CUDA:-}" != 1 ] && ! nvidia-smi >/dev/null 2>&1; then
  echo "candle_cuda tests: SKIPPED (no GPU here; SAFELOAD_REQUIRE_CUDA=1 runs them anyway)"
  exit 0
fi
if [ -n "${wheels:-}" ]; then
  # The libraries candle's cudarc links, beside the compiler (pip --target leaves a folder that
  # is there already as it is), under the names the linker looks for; libcuda is the driver's.
  libs="$wheels/libs"
  if [ ! -e "$libs/nvidia/cu13/lib/libcublas.so.13" ]; then
    pip install --quiet --no-deps --target "$libs" \
      nvidia-cublas==13.0.2.14 nvidia-curand==10.4.0.35 nvidia-cuda-nvrtc==13.0.88
  fi
  for lib in "$CUDA_ROOT/lib/libcudart.so.13" "$libs"/nvidia/cu13/lib/lib{cublas,cublasLt,nvrtc}.so.13 \
    "$libs/nvidia/cu13/lib/libcurand.so.10"; do
    ln -sf "$lib" "$CUDA_ROOT/lib/$(basename "$lib" | sed -E 's/[.]so[.].*/.so/')"
  done
  driver="$(ldconfig -p | awk '/libcuda[.]so[.]1 /{print $NF; exit}')"
  if [ -n "$driver" ]; then
    ln -sf "$driver" "$CUDA_ROOT/lib/libcuda.so"
  fi
  export LD_LIBRARY_PATH="$CUDA_ROOT/lib:$libs/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
SAFELOAD_REQUIRE_CUDA=1 cargo test --features "$features" --test it -- candle_cuda::
