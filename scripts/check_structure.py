#!/usr/bin/env python3
"""Checks the crate's structure: no file under src/ over 600 lines (each
opening with its `//!` line), no non-test function over 80 lines, no import
circle between the top-level modules of src/, no import pointing up the layers
listed in docs/ARCHITECTURE.md, and that page's file table naming every source
file (and no file that is gone).

    python3 scripts/check_structure.py [CRATE_DIR]      # exit 1 on a breach (default: the facade, then each crate of crates/)
    python3 scripts/check_structure.py --graph          # the edges, for the picture

What counts as an import: every `crate::<module>` path (also inside `use
crate::{..}` groups and `super::` paths that climb to the root) in the code
that is built without `cfg(test)`, comments, strings and test modules left
out. A path through the root (`crate::Loader`) counts as an import of the
module the root re-exports it from. The module tree is followed from
`src/lib.rs` through its `mod` declarations (and their `path` attributes), so
a test module's file is known as one whatever its name.

The layers are data in docs/ARCHITECTURE.md: the fenced block after the line
`<!-- layers: read by scripts/check_structure.py -->`, one layer per line, top
first, `name: module module ..`. A module imports modules of its own layer
(no circle among them) and of the layers below, never one of a layer above;
every top-level module of src/ is in exactly one layer (`lib` is the crate
root, `lib.rs`).

What counts as a long function (the project's rule, also a hook's): in every
`.rs` file under src/ but test files (named `tests.rs` or `*_tests.rs`, or
under a folder named `tests`), a line that starts a function (`fn name`,
after `pub`, `pub(..)`, `const`, `async`, `unsafe`, `extern ".."`, from the
line's first non-space character) down to the line that closes its body (for
rustfmt's code, the first later line that is its indentation and `}`): end -
start + 1 lines, at most 80. A function without a body (`fn f(&self);`) is
none; a nested function counts on its own as well as within the outer one.
Comments and string literals are no code. Left out: items built only under
`cfg(test)` (the attribute on a `mod`, `fn`, `impl`, `use`, `const`,
`static`, `trait`, .. item: that item, to its `;` or its closing brace), and
so the body of a `#[cfg(test)] mod tests { .. }`; the code after such an item
still counts.
"""
import re
import sys
from pathlib import Path

MAX_LINES = 600
MAX_FN_LINES = 80
LAYERS_MARKER = "<!-- layers: read by scripts/check_structure.py -->"
FILE_TABLE_HEADING = "## One line per file"
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
ROOT = "lib"


def blank(text):
    """The text with every character but newlines turned into a space."""
    return re.sub(r"[^\n]", " ", text)


CHAR_LITERAL = re.compile(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'\n])'")
RAW_STRING = re.compile(r'b?r(#*)"')


def mask(src, keep_strings):
    """`src` with comments blanked and, unless `keep_strings`, the insides of
    string and char literals too: the same length, lines where they were."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        prev_ident = i > 0 and (src[i - 1].isalnum() or src[i - 1] == "_")
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(src[i:j]))
            i = j
        elif src.startswith("/*", i):
            depth, j = 0, i
            while j < n:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                    if depth == 0:
                        break
                else:
                    j += 1
            out.append(blank(src[i:j]))
            i = j
        elif not prev_ident and RAW_STRING.match(src, i):
            m = RAW_STRING.match(src, i)
            end = src.find('"' + m.group(1), m.end())
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append(src[i:end] if keep_strings else blank(src[i:end]))
            i = end
        elif c == '"' or (c == "b" and not prev_ident and src.startswith('b"', i)):
            j = i + (2 if c == "b" else 1)
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(src[i:j] if keep_strings else blank(src[i:j]))
            i = j
        elif c == "'" and CHAR_LITERAL.match(src, i):
            m = CHAR_LITERAL.match(src, i)
            out.append(src[i:m.end()] if keep_strings else blank(src[i:m.end()]))
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching(text, open_at):
    """The index just past the bracket that closes the one at `open_at`."""
    pairs = {"{": "}", "(": ")", "[": "]"}
    stack = []
    for j in range(open_at, len(text)):
        ch = text[j]
        if ch in pairs:
            stack.append(pairs[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
            if not stack:
                return j + 1
    return len(text)


TEST_CFG = re.compile(r"#\s*\[\s*cfg\s*\(\s*(?:test|all\s*\(\s*test\b[^\]]*\))\s*\)\s*\]")
ATTRIBUTE = re.compile(r"\s*#\s*\[")


def test_regions(code):
    """The spans of items built only under `cfg(test)`, and the names of the
    outline modules (`mod x;`) among them."""
    regions, test_mods = [], set()
    for m in TEST_CFG.finditer(code):
        j = m.end()
        while True:
            a = ATTRIBUTE.match(code, j)
            if not a:
                break
            j = matching(code, a.end() - 1)
        item = re.match(r"\s*(?:pub\s*(?:\([^)]*\))?\s*)?(\w+)(?:\s+(" + IDENT + r"))?", code[j:])
        keyword = item.group(1) if item else ""
        end = item_end(code, j, keyword)
        if keyword == "mod" and item.group(2) and code[j:end].rstrip().endswith(";"):
            test_mods.add(item.group(2))
        regions.append((m.start(), end))
    return regions, test_mods


def inside(pos, regions):
    return any(a <= pos < b for a, b in regions)


FN_START = re.compile(
    r'^(\s*)(pub(\([a-z:]+\))? )?(const )?(async )?(unsafe )?(extern "[^"]*" )?fn (\w+)'
)
TEST_ITEM = re.compile(
    r"\s*(?:pub\s*(?:\([^)]*\))?\s*)?"
    r"(mod|fn|impl|use|const|static|struct|enum|union|trait|type|unsafe|async|extern|macro_rules)\b"
)


def item_end(code, j, keyword):
    """The index just past the item starting at `j`: its `;`, or the brace
    closing its body (a `use` group is no body)."""
    k = j
    while k < len(code):
        ch = code[k]
        if ch == ";":
            return k + 1
        if ch in "([":
            k = matching(code, k)
            continue
        if ch == "{":
            if keyword == "use":
                k = matching(code, k)
                continue
            return matching(code, k)
        if ch == "}":  # the block around it closes: no item after all
            return k
        k += 1
    return len(code)


def test_item_lines(code):
    """The (first, last) lines of the items built only under `cfg(test)`: a
    `#[cfg(test)]` (or `cfg(all(test, ..))`) attribute, any attributes after
    it, and the item they are on. One on a field, a statement or a match arm
    is no item, and hides nothing."""
    spans = []
    for m in TEST_CFG.finditer(code):
        j = m.end()
        while True:
            a = ATTRIBUTE.match(code, j)
            if not a:
                break
            j = matching(code, a.end() - 1)
        item = TEST_ITEM.match(code, j)
        if not item:
            continue
        end = item_end(code, item.end(), item.group(1))
        first = code.count("\n", 0, m.start()) + 1
        last = code.count("\n", 0, max(end - 1, m.start())) + 1
        spans.append((first, last))
    return spans


def is_test_file(rel):
    """A file of tests by its path under src/: `tests.rs`, `*_tests.rs`, or
    under a folder named `tests`."""
    parts = rel.parts
    return rel.name == "tests.rs" or rel.name.endswith("_tests.rs") or "tests" in parts[:-1]


def functions(text):
    """Every function with a body outside the `cfg(test)` items of `text`:
    (line, name, lines), line counted from 1."""
    with_strings = mask(text, keep_strings=True)
    code = mask(text, keep_strings=False)
    hidden = test_item_lines(code)
    starts, at = [], 0
    for line in code.split("\n"):
        starts.append(at)
        at += len(line) + 1
    out = []
    for number, line in enumerate(with_strings.split("\n"), 1):
        m = FN_START.match(line)
        if not m:
            continue
        start = starts[number - 1]
        fn_at = start + m.start(8) - 3
        if code[fn_at:fn_at + 2] != "fn":  # a string's text, not code
            continue
        if any(a <= number <= b for a, b in hidden):
            continue
        k, body = start + m.end(), None
        while k < len(code):
            ch = code[k]
            if ch == ";" or ch == "}":
                break
            if ch in "([":
                k = matching(code, k)
                continue
            if ch == "{":
                body = k
                break
            k += 1
        if body is None:  # a declaration: `fn f(&self);`
            continue
        close = matching(code, body) - 1
        end = code.count("\n", 0, close) + 1
        out.append((number, m.group(8), end - number + 1))
    return out


def long_functions(crate):
    """Every non-test function under src/ over MAX_FN_LINES lines, as lines
    of text: `path:line name (N lines, at most 80)`."""
    src = crate / "src"
    problems = []
    for path in sorted(src.rglob("*.rs")):
        if is_test_file(path.relative_to(src)):
            continue
        for line, name, length in functions(path.read_text()):
            if length > MAX_FN_LINES:
                problems.append(
                    f"{path.relative_to(crate)}:{line} {name} "
                    f"({length} lines, at most {MAX_FN_LINES})"
                )
    return problems


MOD_DECL = re.compile(
    r"((?:#\s*\[[^\]]*\]\s*)*)(?:pub\s*(?:\([^)]*\))?\s*)?\bmod\s+(" + IDENT + r")\s*;"
)
INLINE_MOD = re.compile(r"\bmod\s+(" + IDENT + r")\s*\{")


class Source:
    """One file of the module tree: its module path, text and non-test code."""

    def __init__(self, path, module):
        self.path = path
        self.module = module  # e.g. ["prefetch", "worker"]; [] for lib.rs
        self.text = path.read_text()
        with_strings = mask(self.text, keep_strings=True)
        code = mask(self.text, keep_strings=False)
        self.regions, test_mods = test_regions(code)
        self.code = "".join(
            blank(ch) if inside(i, self.regions) else ch for i, ch in enumerate(code)
        ) if self.regions else code
        self.children = []
        for m in MOD_DECL.finditer(with_strings):
            name = m.group(2)
            if name in test_mods or inside(m.start(2), self.regions):
                continue
            if inside_inline_module(code, m.start(2)):
                continue
            paths = re.findall(r'path\s*=\s*"([^"]+)"', m.group(1))
            self.children.append((name, paths))
        self.inline = [
            (m.group(1), m.end() - 1, matching(self.code, m.end() - 1))
            for m in INLINE_MOD.finditer(self.code)
        ]

    def line_of(self, pos):
        return self.text.count("\n", 0, pos) + 1

    def module_at(self, pos):
        """The module path at `pos`, inline modules included."""
        path = list(self.module)
        for name, a, b in self.inline:
            if a <= pos < b:
                path.append(name)
        return path


def inside_inline_module(code, pos):
    for m in INLINE_MOD.finditer(code):
        if m.end() - 1 <= pos < matching(code, m.end() - 1):
            return True
    return False


def module_tree(src_dir):
    """Every non-test source file reached from lib.rs, by its module path."""
    files = []
    todo = [(src_dir / "lib.rs", [])]
    while todo:
        path, module = todo.pop()
        source = Source(path, module)
        files.append(source)
        is_dir_owner = path.name in ("lib.rs", "mod.rs")
        base = path.parent if is_dir_owner else path.parent / path.stem
        for name, paths in source.children:
            candidates = [path.parent / p for p in paths] or [
                base / f"{name}.rs",
                base / name / "mod.rs",
            ]
            for candidate in candidates:
                if candidate.is_file():
                    todo.append((candidate, module + [name]))
                    if not paths:
                        break
    return files


def split_group(text):
    """The elements of a `{a, b::c, d::{e}}` group, split at top-level commas."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def first_names(code, pos):
    """The first segment of each path starting at `pos` (a name or a group)."""
    if code[pos] == "{":
        end = matching(code, pos)
        names = []
        for part in split_group(code[pos + 1:end - 1]):
            m = re.match(IDENT, part)
            if m:
                names.append(m.group(0))
        return names
    m = re.match(IDENT, code[pos:])
    return [m.group(0)] if m else []


def root_names(lib, modules):
    """What a `crate::<name>` path means at the root: name -> module."""
    names = {}
    for m in re.finditer(r"\buse\s+([^;]+);", lib.code):
        for path, alias in expand_use(m.group(1).replace("\n", " ")):
            segments = [s for s in path if s not in ("crate", "self")]
            if segments and segments[0] in modules:
                names[alias] = segments[0]
    for m in re.finditer(r"\b(?:fn|struct|enum|trait|type|const|static)\s+(" + IDENT + ")", lib.code):
        names.setdefault(m.group(1), ROOT)
    return names


def expand_use(tree, prefix=()):
    """`a::{b, c::d as e}` -> [(["a","b"], "b"), (["a","c","d"], "e")]."""
    tree = tree.strip().lstrip(":").strip()
    m = re.match(r"((?:" + IDENT + r"\s*::\s*)*)\{", tree)
    if m and tree.endswith("}"):
        head = tuple(s.strip() for s in m.group(1).split("::") if s.strip())
        out = []
        for part in split_group(tree[m.end():-1]):
            out += expand_use(part, prefix + head)
        return out
    alias = None
    am = re.match(r"(.*)\bas\s+(" + IDENT + r")\s*$", tree)
    if am:
        tree, alias = am.group(1), am.group(2)
    segments = tuple(s.strip() for s in tree.split("::") if s.strip())
    if not segments or segments[-1] == "*":
        return []
    full = prefix + segments
    if segments[-1] == "self":
        full = full[:-1]
    return [(list(full), alias or full[-1])] if full else []


CRATE_PATH = re.compile(r"\bcrate\s*::\s*(?=[A-Za-z_{])")
SUPER_PATH = re.compile(r"(?<![\w:])(?:self\s*::\s*)?((?:super\s*::\s*)+)(?=[A-Za-z_{])")


def imports(files):
    """(from module, to module) -> [(file, line)], between top-level modules."""
    modules = {f.module[0] for f in files if f.module}
    lib = next(f for f in files if not f.module)
    at_root = root_names(lib, modules)

    def resolve(name):
        if name in modules:
            return name
        return at_root.get(name)

    edges = {}

    def add(source, pos, names):
        here = source.module[0] if source.module else ROOT
        for name in names:
            target = resolve(name)
            if target and target != here:
                edges.setdefault((here, target), []).append((source.path, source.line_of(pos)))

    for source in files:
        code = source.code
        for m in CRATE_PATH.finditer(code):
            add(source, m.start(), first_names(code, m.end()))
        for m in SUPER_PATH.finditer(code):
            ups = m.group(1).count("super")
            path = source.module_at(m.start())
            if ups >= len(path):  # climbs to the root: what follows is a root name
                add(source, m.start(), first_names(code, m.end()))
        if not source.module:  # the root names its modules by bare paths
            for m in re.finditer(r"(?<![\w:])(" + IDENT + r")\s*::", code):
                if m.group(1) in modules:
                    add(source, m.start(), [m.group(1)])
    return modules, edges


def circles(modules, edges):
    """The strongly connected components of more than one module (Tarjan)."""
    graph = {m: sorted({b for (a, b) in edges if a == m}) for m in modules | {ROOT}}
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def shortest_cycle(comp, edges):
    """A shortest circle through the modules of `comp`, as the modules met
    (the first again at the end)."""
    inside = set(comp)
    best = None
    for start in comp:
        previous = {start: None}
        queue = [start]
        found = None
        while queue and not found:
            nxt = []
            for a in queue:
                for b in sorted(b for (x, b) in edges if x == a and b in inside):
                    if b == start:
                        found = a
                        break
                    if b not in previous:
                        previous[b] = a
                        nxt.append(b)
                if found:
                    break
            queue = nxt
        if found is None:
            continue
        path = [start]
        at = found
        while at != start:
            path.append(at)
            at = previous[at]
        cycle = [start] + path[:0:-1] + [start]
        if best is None or len(cycle) < len(best):
            best = cycle
    return best or list(comp) + [comp[0]]


def read_layers(doc, crate=None):
    """The layers block of ARCHITECTURE.md: [(layer name, [modules])], top first; of the
    workspace crate `crate` where named (the block after `<!-- layers of NAME: ... -->`)."""
    text = doc.read_text()
    marker = LAYERS_MARKER if crate is None else LAYERS_MARKER.replace("layers:", f"layers of {crate}:")
    at = text.find(marker)
    if at < 0:
        raise SystemExit(f"{doc}: no line `{marker}`")
    block = re.search(r"```[^\n]*\n(.*?)```", text[at:], re.S)
    if not block:
        raise SystemExit(f"{doc}: no fenced block after the layers marker")
    layers = []
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        name, _, mods = line.partition(":")
        layers.append((name.strip(), mods.split()))
    return layers


def file_table(doc):
    """The paths named in the first column of the "One line per file" table
    (relative to src/; a folder ends in `/`)."""
    text = doc.read_text()
    at = text.find(FILE_TABLE_HEADING)
    if at < 0:
        raise SystemExit(f"{doc}: no section `{FILE_TABLE_HEADING}`")
    section = text[at:]
    following = section.find("\n## ", len(FILE_TABLE_HEADING))
    if following >= 0:
        section = section[:following]
    names = []
    for line in section.splitlines():
        cells = line.split("|")
        if line.startswith("|") and len(cells) > 2:
            names += re.findall(r"`([^`]+)`", cells[1])
    return names


def rows_of(names, label):
    """The table's rows of one crate: all of them for a crate with a page of its own
    (`label` None); else those under its name, or, for the core, those under no crate's."""
    if label is None:
        return names
    crate, others = label
    if crate == "core":
        return [n for n in names if n.split("/")[0] not in others]
    return [n[len(crate) + 1 :] for n in names if n.startswith(crate + "/")]


# The facade's name in the file table and the layers blocks.
FACADE = "safeload"


def check(crate):
    """Every breach of the rules, as lines of text."""
    src = crate / "src"
    doc = crate / "docs" / "ARCHITECTURE.md"
    # A crate of the workspace (crates/NAME): the page is the workspace's, its files
    # are the table's rows under `NAME/` (the core's: the rows under no crate's name),
    # its layers the block marked with its name (the core's: the first).
    # The facade (the workspace's root crate): its rows are under `safeload/`.
    label = None
    workspace = Path(__file__).resolve().parent.parent
    facade = crate.resolve() == workspace
    if facade or not doc.exists():
        doc = workspace / "docs" / "ARCHITECTURE.md"
        others = {p.name for p in (workspace / "crates").iterdir() if p.is_dir()} | {FACADE}
        label = (FACADE if facade else crate.resolve().name, others - {"core"})
    problems = []
    for path in sorted(src.rglob("*.rs")):
        text = path.read_text()
        lines = text.count("\n")
        if lines > MAX_LINES:
            problems.append(f"{path.relative_to(crate)}: {lines} lines (at most {MAX_LINES})")
        if not text.startswith("//!"):
            problems.append(f"{path.relative_to(crate)}: no `//!` line first, saying its one job")
    problems += long_functions(crate)
    files = module_tree(src)
    modules, edges = imports(files)

    named = rows_of(file_table(doc), label)
    for source in files:
        rel = source.path.relative_to(src).as_posix()
        if not any(rel == n or (n.endswith("/") and rel.startswith(n)) for n in named):
            problems.append(f"docs/ARCHITECTURE.md: src/{rel} is in no row of the file table")
    for name in named:
        if not (src / name).exists():
            problems.append(f"docs/ARCHITECTURE.md: the file table names src/{name}, which is gone")

    def where(a, b):
        path, line = edges[(a, b)][0]
        return f"{path.relative_to(crate)}:{line}"

    for comp in circles(modules, edges):
        cycle = shortest_cycle(comp, edges)
        steps = "; ".join(f"{a} -> {b} ({where(a, b)})" for a, b in zip(cycle, cycle[1:]))
        problems.append(f"import circle between {', '.join(comp)}: {steps}")

    layers = read_layers(doc, None if label is None or label[0] == "core" else label[0])
    level = {}
    for depth, (name, mods) in enumerate(layers):
        for mod in mods:
            if mod in level:
                problems.append(f"layers: `{mod}` is listed twice")
            level[mod] = (depth, name)
    for mod in sorted((modules | {ROOT}) - set(level)):
        problems.append(f"layers: module `{mod}` is in no layer of docs/ARCHITECTURE.md")
    for mod in sorted(set(level) - modules - {ROOT}):
        problems.append(f"layers: `{mod}` is listed but is no module of src/")
    for (a, b) in sorted(edges):
        if a in level and b in level and level[b][0] < level[a][0]:
            problems.append(
                f"upward import: {a} ({level[a][1]}) imports {b} ({level[b][1]}), "
                f"a layer above ({where(a, b)})"
            )
    return problems


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    workspace = Path(__file__).resolve().parent.parent
    crates = (
        [Path(args[0])]
        if args
        else [workspace] + sorted(p for p in (workspace / "crates").iterdir() if p.is_dir())
    )
    if "--graph" in sys.argv:
        modules, edges = imports(module_tree(crates[0] / "src"))
        for (a, b), at in sorted(edges.items()):
            print(f"{a} -> {b}  ({len(at)}: {at[0][0].relative_to(crates[0])}:{at[0][1]})")
        return 0
    problems = [p for crate in crates for p in check(crate)]
    for p in problems:
        print(p)
    if problems:
        print(f"structure check: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(
        "structure check: no file over 600 lines, no non-test function over 80 lines, "
        "no import circle, every import down the layers, every file in the table"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
