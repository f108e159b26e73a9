#!/usr/bin/env python3
"""Runs two builds of the load benchmark (before and after a change) in
alternating rounds, one round each in turn, and prints per scenario and arm
the median seconds (min-max) of each build and their ratio.

    cargo bench --bench load --no-run          # the "after" binary
    python3 benches/compare_versions.py BEFORE_BIN AFTER_BIN --rounds 5 -- \
        --size-gib 2 --shards 8 --scenarios warm,cold,fuse --arms safeload-auto,...

Each run of a binary interleaves its arms, each in a child process, as
`cargo bench --bench load` does; alternating whole runs of the two builds
keeps a noisy machine's drift out of the ratio.
"""
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def main():
    args = sys.argv[1:]
    if len(args) < 2 or "-h" in args or "--help" in args:
        print(__doc__)
        sys.exit(2)
    before, after, rest = args[0], args[1], args[2:]
    rounds = 5
    if rest[:1] == ["--rounds"]:
        rounds = int(rest[1])
        rest = rest[2:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    out = Path(tempfile.mkdtemp(prefix="safeload-compare-"))
    samples = {"before": [], "after": []}
    for r in range(rounds):
        order = [("before", before), ("after", after)]
        if r % 2:
            order.reverse()
        for name, binary in order:
            path = out / f"{name}-{r}.json"
            cmd = [binary, "--rounds", "1", "--json", str(path), *rest]
            print(f"round {r}: {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            samples[name] += json.loads(path.read_text())["samples"]
    keys = []
    for s in samples["before"] + samples["after"]:
        k = (s["scenario"], s["arm"])
        if k not in keys:
            keys.append(k)
    print("| scenario | arm | before s | after s | after / before |")
    print("|---|---|---|---|---|")
    for scenario, arm in keys:
        cell = {}
        for name in ("before", "after"):
            t = [s["seconds"] for s in samples[name]
                 if s["scenario"] == scenario and s["arm"] == arm and not s.get("error")]
            cell[name] = t
        def fmt(t):
            if not t:
                return "-"
            return f"{statistics.median(t):.3f} ({min(t):.3f}-{max(t):.3f}) n={len(t)}"
        ratio = "-"
        if cell["before"] and cell["after"]:
            ratio = f"{statistics.median(cell['after']) / statistics.median(cell['before']):.2f}"
        print(f"| {scenario} | {arm} | {fmt(cell['before'])} | {fmt(cell['after'])} | {ratio} |")
    print(f"samples in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
