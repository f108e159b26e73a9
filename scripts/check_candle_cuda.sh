#!/usr/bin/env bash
# Checks that an application depending on safeload with `candle` and `cuda`, and on
# candle-core with its own `cuda`, resolves to one cudarc (the features unify; no CUDA
# version pinned here clashes with candle's detection). Resolution only: building
# candle's CUDA kernels (candle-kernels) needs `nvcc`; scripts/check_candle_cuda_glue.sh does.
set -euo pipefail
crate="$(cd "$(dirname "$0")/.." && pwd)"
probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
mkdir -p "$probe/src"
echo 'fn main() {}' > "$probe/src/main.rs"
cat > "$probe/Cargo.toml" <<TOML
[package]
name = "candle-cuda-probe"
version = "0.0.0"
edition = "2024"
publish = false

[workspace]

[dependencies]
safeload = { path = "$crate", features = ["candle", "cuda"] }
candle-core = { version = "0.11", features = ["cuda"] }
TOML
# `cargo tree -i` fails where more than one cudarc is in the graph.
one="$(cd "$probe" && cargo tree --quiet -i cudarc --depth 0)"
echo "candle + cuda resolve to one cudarc: $one"
