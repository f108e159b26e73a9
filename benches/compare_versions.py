#!/usr/bin/env python3
"""Runs two builds of the load benchmark, or of the remote one (before and after a change) in
alternating rounds, one round each in turn, and prints per scenario and arm
the median seconds (min-max) of each build and their ratio.

    cargo bench --bench load --no-run          # the "after" binary
    python3 benches/compare_versions.py BEFORE_BIN AFTER_BIN --rounds 5 -- \
        --size-gib 2 --shards 8 --scenarios warm,cold,fuse --arms safeload-auto,...

Each run of a binary interleaves its arms, each in a child process, as
`cargo bench --bench load` does, in an order shuffled each round;
alternating whole runs of the two builds keeps a noisy machine's drift out
of the ratio.

`--after-arms A,B` (before `--`) adds arms that only the after build has (a
bound such as `fresh-direct-32`, the same reads into fresh memory) to its
`--arms`; the table gives them with the after build's figures. Each cell
also gives the median system CPU time of the arm's process where the build
reports it.
"""
import json
import random
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
    after_arms = []
    while rest[:1] in (["--rounds"], ["--after-arms"]):
        if rest[0] == "--rounds":
            rounds = int(rest[1])
        else:
            after_arms = rest[1].split(",")
        rest = rest[2:]
    if rest[:1] == ["--"]:
        rest = rest[1:]

    def args_of(name, r):
        """The benchmark's arguments for one build in round `r`: the after
        build's arms with `--after-arms` added, and the arms in an order
        shuffled with the round as the seed (each run is one round of the
        benchmark, which runs its arms in the order given): no arm always
        follows the same neighbour."""
        out = list(rest)
        if name == "after" and after_arms:
            if "--arms" in out:
                at = out.index("--arms") + 1
                out[at] = ",".join([out[at], *after_arms])
            else:
                out += ["--arms", ",".join(after_arms)]
        if "--arms" in out:
            at = out.index("--arms") + 1
            arms = out[at].split(",")
            random.Random(r).shuffle(arms)
            out[at] = ",".join(arms)
        return out

    out = Path(tempfile.mkdtemp(prefix="safeload-compare-"))
    samples = {"before": [], "after": []}
    for r in range(rounds):
        order = [("before", before), ("after", after)]
        if r % 2:
            order.reverse()
        for name, binary in order:
            path = out / f"{name}-{r}.json"
            cmd = [binary, "--rounds", "1", "--json", str(path), *args_of(name, r)]
            print(f"round {r}: {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            samples[name] += [flat(s) for s in json.loads(path.read_text())["samples"]]
    keys = []
    for s in samples["before"] + samples["after"]:
        k = (s["scenario"], s["arm"])
        if k not in keys:
            keys.append(k)
    print("| scenario | arm | before s | after s | after / before |")
    print("|---|---|---|---|---|")
    for scenario, arm in keys:
        cell, sys_time = {}, {}
        for name in ("before", "after"):
            runs = [s for s in samples[name]
                    if s["scenario"] == scenario and s["arm"] == arm and not s.get("error")]
            cell[name] = [s["seconds"] for s in runs]
            sys_time[name] = [s["sys_seconds"] for s in runs if s.get("sys_seconds") is not None]
        def fmt(name):
            t = cell[name]
            if not t:
                return "-"
            text = f"{statistics.median(t):.3f} ({min(t):.3f}-{max(t):.3f}) n={len(t)}"
            if sys_time[name]:
                text += f", sys {statistics.median(sys_time[name]):.2f}"
            return text
        ratio = "-"
        if cell["before"] and cell["after"]:
            ratio = f"{statistics.median(cell['after']) / statistics.median(cell['before']):.2f}"
        print(f"| {scenario} | {arm} | {fmt('before')} | {fmt('after')} | {ratio} |")
    print(f"samples in {out}", file=sys.stderr)


def flat(sample):
    """One sample in the load benchmark's shape: the remote benchmark's
    (`benches/remote.rs`) names its server where the load's names a scenario,
    and keeps its seconds under `figures`."""
    if "scenario" in sample:
        return sample
    figures = sample.get("figures") or {}
    return {
        "scenario": sample.get("server", "-"),
        "arm": sample["arm"],
        "error": sample.get("error") or figures.get("error"),
        "seconds": figures.get("seconds"),
        "sys_seconds": figures.get("sys_seconds"),
    }


if __name__ == "__main__":
    main()
