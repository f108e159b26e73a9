#!/usr/bin/env bash
# The device check of issue 53, for a machine with one NVIDIA GPU, PyTorch and the
# `safetensors` Python package, and no Rust toolchain or registry: prints one line per
# figure, within 8 minutes.
#
#   roofline: host-to-device 1 GiB pinned / pageable        (the roofline)
#   staged load (whole) of 8 GiB warm: X GB/s ...          every byte copied back and compared
#   staged load (TP rank 0/2 part) ...                     the same, a tensor-parallel part
#   pytorch load_file(device="cuda") ... X GB/s            the peer, on the same files
#
# Built here (2 vCPUs, no CUDA; the driver is loaded at run time):
#   CUDARC_CUDA_VERSION=12020 cargo build --release --features cuda --example device_check
#   mkdir -p carry && cp target/release/examples/device_check scripts/device_check.sh \
#       scripts/device_check_torch.py carry/
# then on the GPU machine: `bash carry/device_check.sh` (DEVICE_CHECK_DIR for the 8 GiB of
# shards it writes, default /tmp/safeload-device-check; removed at the end unless
# DEVICE_CHECK_KEEP=1). Targets: the staged load >= 0.9x the pinned roofline and >= 2x
# PyTorch's load.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${DEVICE_CHECK_BIN:-$here/device_check}"
dir="${DEVICE_CHECK_DIR:-/tmp/safeload-device-check}"
deadline=$((SECONDS + 480))

left() { echo $((deadline - SECONDS)); }
run() {
  local t; t=$(left)
  if [ "$t" -le 0 ]; then echo "device_check: out of time before: $*" >&2; exit 1; fi
  timeout "$t" "$@"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/gpu: /' || true
run "$bin" roofline 1
run "$bin" generate "$dir" 8 16
run "$bin" load "$dir"
run "$bin" load "$dir" 0/2
run python3 "$here/device_check_torch.py" "$dir"
if [ "${DEVICE_CHECK_KEEP:-0}" != 1 ]; then rm -rf "$dir"; fi
