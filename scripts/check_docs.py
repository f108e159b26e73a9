#!/usr/bin/env python3
"""Checks that safeload's rendered docs teach only what a caller can use.

    RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --features candle,tracing,serde
    python3 scripts/check_docs.py [target/doc/safeload] [src] [examples]

rustdoc itself refuses links to private items and links it cannot resolve
(`[lints.rustdoc]` in Cargo.toml). What it lets through, this refuses:

- a link in the rendered pages that leads nowhere: a relative link to a page
  that was not generated, or an explicit link (`[text](path)`) whose path
  rustdoc left as it was (an item it could not link, a `#[doc(hidden)]` one
  or another crate's that `--no-deps` does not document);
- code in a rendered doc block (an example, or a name in backticks) that
  names a `#[doc(hidden)]` item of the crate: rustdoc prints a link to a
  hidden item as plain code, so the reader is sent to something that has no
  page;
- a hidden line (`# ...`) of a doc example, or a line of `examples/`, that
  calls a hidden item through `safeload::`: what a reader copies must work
  with the documented API alone.

The hidden items are read from the source: every item, field, method or
re-export under `#[doc(hidden)]`. Only the item docs of each page are read,
not the trait implementations rustdoc copies from other crates.
"""
import html
import re
import sys
from pathlib import Path

# The sections of a page that hold other crates' docs (trait and blanket impls).
FOREIGN = re.compile(
    r'<h2 id="(?:trait-implementations|synthetic-implementations|blanket-implementations)"'
)
ITEM = re.compile(
    r"pub(?:\([^)]*\))?\s+(?:(?:const|unsafe|async|extern)\s+)*"
    r"(?:fn|struct|enum|mod|const|static|type|trait|union)\s+([A-Za-z_][A-Za-z_0-9]*)"
)
FIELD = re.compile(r"pub\s+([a-z_][a-z_0-9]*)\s*:")
REEXPORT = re.compile(r"pub use (.*);")
# Files a page links to that are not pages.
ASSETS = (".html", "/", ".css", ".js", ".svg", ".png", ".ico", ".woff2")


def hidden_names(src: Path) -> set:
    """Every name declared or re-exported under `#[doc(hidden)]` in `src` (a line of its
    own; the core's modules its plug-in crates build on are hidden with a comment after the
    attribute, `#[doc(hidden)] // for the plug-in crates`, and are no names a reader meets)."""
    names = set()
    for path in sorted(src.rglob("*.rs")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() != "#[doc(hidden)]":
                continue
            j = i + 1
            while j < len(lines) and lines[j].strip().startswith(("#[", "///", "//")):
                j += 1
            if j >= len(lines):
                continue
            text = lines[j].strip()
            while text.startswith("pub use") and not text.endswith(";") and j + 1 < len(lines):
                j += 1
                text += " " + lines[j].strip()
            names.update(declared(text))
    return names


def declared(text: str) -> list:
    """The names a declaration (`pub fn x`, `pub x: T`, `pub use a::{b, c as d}`) makes."""
    m = ITEM.match(text)
    if m:
        return [m.group(1)]
    m = FIELD.match(text)
    if m:
        return [m.group(1)]
    m = REEXPORT.match(text)
    if not m:
        return []
    body = m.group(1)
    inner = re.search(r"\{(.*)\}", body)
    parts = inner.group(1).split(",") if inner else [body]
    out = []
    for part in parts:
        part = part.strip()
        if part:
            out.append(part.split(" as ")[-1].split("::")[-1].strip())
    return out


def plain(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def check_pages(doc: Path, hidden: set) -> list:
    """Dead links and hidden names in the rendered pages under `doc`."""
    problems = []
    for page in sorted(doc.rglob("*.html")):
        rel = page.relative_to(doc)
        if rel.parts and rel.parts[0] == "src":
            continue
        text = page.read_text()
        cut = FOREIGN.search(text)
        if cut:
            text = text[: cut.start()]
        for href in re.findall(r'href="([^"]*)"', text):
            target = href.split("#")[0]
            if not target or target.startswith(("http:", "https:", "mailto:")) or "${" in target:
                continue
            if not target.endswith(ASSETS):
                problems.append(f"{rel}: a link rustdoc could not make: {href}")
            elif not (page.parent / target).resolve().exists():
                problems.append(f"{rel}: a link to a page that does not exist: {href}")
        for block in re.findall(r'<div class="docblock[^"]*">(.*?)</div>', text, re.S):
            for code in re.findall(r"<code>(.*?)</code>", block, re.S):
                words = set(re.split(r"[^A-Za-z0-9_]+", plain(code)))
                named = sorted(words & hidden)
                if named:
                    snippet = " ".join(plain(code).split())[:80]
                    problems.append(f"{rel}: names hidden {', '.join(named)} in `{snippet}`")
    return problems


def calls_hidden(line: str, hidden: set) -> list:
    """The hidden names `line` reaches through `safeload::`."""
    found = []
    for path in re.findall(r"safeload::([A-Za-z_0-9:{}, ]+)", line):
        words = set(re.split(r"[^A-Za-z0-9_]+", path))
        found.extend(sorted(words & hidden))
    return found


def check_sources(src: Path, examples: Path, hidden: set) -> list:
    """Hidden doc-example lines and example lines that call hidden items."""
    problems = []
    for path in sorted(src.rglob("*.rs")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = re.match(r"\s*//[/!] ?# (.*)", line)
            if m:
                for name in calls_hidden(m.group(1), hidden):
                    problems.append(f"{path}:{n}: a doc example's hidden line calls hidden {name}")
    if examples.is_dir():
        for path in sorted(examples.rglob("*.rs")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                for name in calls_hidden(line, hidden):
                    problems.append(f"{path}:{n}: an example calls hidden {name}")
    return problems


def main(argv: list) -> int:
    doc = Path(argv[1] if len(argv) > 1 else "target/doc/safeload")
    src = Path(argv[2] if len(argv) > 2 else "src")
    examples = Path(argv[3] if len(argv) > 3 else "examples")
    if not (doc / "index.html").exists():
        print(f"{doc}/index.html is missing: run cargo doc first", file=sys.stderr)
        return 2
    hidden = hidden_names(src)
    problems = check_pages(doc, hidden) + check_sources(src, examples, hidden)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} problem(s): the docs send readers to what they cannot use")
        return 1
    print(f"docs: every link leads to a page, no hidden item named ({len(hidden)} hidden)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
