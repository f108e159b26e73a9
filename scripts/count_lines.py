#!/usr/bin/env python3
"""Counts the non-test lines of the library crates (the facade's src/ and crates/*/src, or
the source folders given): every line of a `.rs` file under src/ but
files named `tests.rs` or `*_tests.rs`, files under a `tests/` folder, and the
items built only under `cfg(test)` (the structure check's own reading of them,
scripts/check_structure.py). Prints the lines in all, then those that are code
(not blank, not a comment).

    python3 scripts/count_lines.py [SRC_DIR ..]
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_structure as cs  # noqa: E402


def count(src):
    total = code = 0
    for root, _, names in os.walk(src):
        for name in names:
            path = Path(root) / name
            rel = path.relative_to(src)
            if not name.endswith(".rs") or cs.is_test_file(rel):
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            lines = text.split("\n")
            skipped = set()
            for first, last in cs.test_item_lines(cs.mask(text, keep_strings=False)):
                skipped.update(range(first, last + 1))
            for number, line in enumerate(lines, 1):
                if number in skipped:
                    continue
                total += 1
                stripped = line.strip()
                if stripped and not stripped.startswith("//"):
                    code += 1
    return total, code


if __name__ == "__main__":
    roots = [Path(a) for a in sys.argv[1:]]
    if not roots:
        # The library crates: the facade's src/ and each crate's under crates/.
        workspace = Path(__file__).resolve().parent.parent
        roots = [workspace / "src"] + sorted((workspace / "crates").glob("*/src"))
    all_total = all_code = 0
    for root in roots:
        total, code = count(root)
        all_total, all_code = all_total + total, all_code + code
        if len(roots) > 1:
            print(f"  {root}: {total} ({code} of code)")
    print(f"non-test lines: {all_total} ({all_code} of code)")
