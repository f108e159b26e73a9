#!/usr/bin/env python3
"""The peer of scripts/device_check.sh: PyTorch's `safetensors.torch.load_file(...,
device="cuda")` on the same shards, warm in the page cache, every tensor kept on the GPU
until the end (as the staged load keeps its slabs); the best of three, one line."""
import glob
import os
import sys
import time

import torch
from safetensors.torch import load_file


def main():
    files = sorted(glob.glob(os.path.join(sys.argv[1], "*.safetensors")))
    # Warm: every file read once.
    for name in files:
        with open(name, "rb") as f:
            while f.read(16 << 20):
                pass
    torch.zeros(1, device="cuda")
    best, total = float("inf"), 0
    for _ in range(3):
        start = time.perf_counter()
        loaded = [load_file(name, device="cuda") for name in files]
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
        total = sum(t.numel() * t.element_size() for sd in loaded for t in sd.values())
        del loaded
        torch.cuda.empty_cache()
    print(f"pytorch load_file(device=\"cuda\") of {total / 2**30:.2f} GiB warm: "
          f"{total / best / 1e9:.2f} GB/s (torch {torch.__version__})")


if __name__ == "__main__":
    main()
