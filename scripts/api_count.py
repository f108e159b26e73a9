#!/usr/bin/env python3
"""Counts the public API of safeload as an engine author meets it in rustdoc.

    cargo doc --no-deps -p safeload --features candle,tracing
    python3 scripts/api_count.py [target/doc/safeload]

Items: every entry of rustdoc's `all.html` (structs, enums, traits,
functions, type aliases, constants, macros); the public modules are counted
apart; `#[doc(hidden)]` ones are not in rustdoc's output. Root: the items
listed on the crate's front page, re-exports included, modules not. Methods: every
inherent method (`impl Type { pub fn .. }`) of a public type, trait
implementations left out.
"""
import re
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "target/doc/safeload")

all_html = (root / "all.html").read_text()
items = re.findall(r'<li><a href="([^"]+\.html)">', all_html)
modules = [p for p in root.rglob("index.html") if p != root / "index.html"]

index = (root / "index.html").read_text()
# The front page's entries, modules left out (they are counted as items).
root_items = re.findall(r'<dt><a class="(?!mod)[a-z]+" href="[^"]+" title="[^"]+">', index)
root_items += re.findall(r'<dt id="reexport\.[^"]+"', index)

methods = {}
for rel in items:
    page = (root / rel).read_text()
    m = re.search(r'<div id="implementations-list">(.*?)(?:<h2 id="trait-implementations"|<h2 id="synthetic-implementations"|<h2 id="blanket-implementations"|$)', page, re.S)
    if not m:
        continue
    names = re.findall(r'<section id="method\.([A-Za-z0-9_]+)"', m.group(1))
    if names:
        methods[rel] = names

total_methods = sum(len(v) for v in methods.values())
print(f"items: {len(items)} (and {len(modules)} modules)")
print(f"root: {len(root_items)}")
print(f"methods: {total_methods}")
if "-v" in sys.argv:
    for rel in items:
        print("  item", rel)
    for p in modules:
        print("  module", p.relative_to(root))
    for rel, names in sorted(methods.items()):
        print(f"  {rel}: {len(names)} {' '.join(names)}")
