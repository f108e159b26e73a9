#!/usr/bin/env python3
"""Tests of scripts/check_structure.py: small crates written to a temporary
directory, each breaking one rule (or staying within them), and the problems
the check reports for them.

    python3 scripts/test_check_structure.py
"""
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_structure  # noqa: E402

LAYERS = """\
<!-- layers: read by scripts/check_structure.py -->
```text
top: lib api
middle: engine helper
bottom: base
```
"""


def table(paths):
    rows = "".join(f"| `{p}` | a job |\n" for p in paths)
    return f"## One line per file\n\n| file | job |\n|---|---|\n{rows}\n## After\n"


class Crate:
    """A crate in a temporary directory: `files` maps paths under src/ to
    their text (each given its `//!` line unless it has one), and the
    architecture page has the layers above and a table of `rows` (every
    file by default)."""

    def __init__(self, files, rows=None, layers=LAYERS):
        self.dir = tempfile.TemporaryDirectory()
        root = Path(self.dir.name)
        for rel, text in files.items():
            path = root / "src" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            text = textwrap.dedent(text)
            if not text.startswith("//!") and not rel.endswith("nodoc.rs"):
                text = f"//! The job of {rel}.\n" + text
            path.write_text(text)
        (root / "docs").mkdir()
        rows = [r for r in files if "tests" not in r] if rows is None else rows
        (root / "docs" / "ARCHITECTURE.md").write_text(layers + "\n" + table(rows))
        self.root = root

    def problems(self):
        return check_structure.check(self.root)

    def close(self):
        self.dir.cleanup()


LIB = """\
mod api;
mod base;
mod engine;
mod helper;
pub use api::Loader;
"""


def crate(**changes):
    """The base crate (within every rule), with `changes` (a path of None
    drops the file)."""
    files = {
        "lib.rs": LIB,
        "api.rs": "use crate::engine::run;\npub struct Loader;\n",
        "engine.rs": "use crate::{base::Error, helper};\npub fn run() {}\n",
        "helper.rs": "use crate::base;\n",
        "base.rs": "pub struct Error;\n",
    }
    for key, value in changes.items():
        path = key.replace("__", "/").replace("_rs", ".rs")
        if value is None:
            files.pop(path, None)
        else:
            files[path] = value
    return files


def function(name, lines, indent="", head="fn"):
    """A function `name` of `lines` lines (at least 2) at `indent`, its
    signature `head name()`."""
    body = "".join(f"{indent}    let _ = {i};\n" for i in range(lines - 2))
    return f"{indent}{head} {name}() {{\n{body}{indent}}}\n"


class StructureCheck(unittest.TestCase):
    def check(self, files, rows=None, layers=LAYERS):
        c = Crate(files, rows, layers)
        try:
            return c.problems()
        finally:
            c.close()

    def assertOne(self, problems, *words):
        """Exactly one problem, and it says all of `words`."""
        self.assertEqual(len(problems), 1, problems)
        for w in words:
            self.assertIn(w, problems[0])

    def assertHas(self, problems, *words):
        """Some problem says all of `words` (an upward import also closes a
        circle where the module above imports the one below)."""
        self.assertTrue(any(all(w in p for w in words) for p in problems), problems)

    def test_a_crate_within_the_rules_passes(self):
        self.assertEqual(self.check(crate()), [])

    def test_an_import_circle_fails(self):
        problems = self.check(crate(base_rs="use crate::helper;\npub struct Error;\n"))
        circle = [p for p in problems if p.startswith("import circle")]
        self.assertEqual(len(circle), 1, problems)
        self.assertIn("base, helper", circle[0])
        self.assertIn("src/base.rs:2", circle[0])  # where base imports helper

    def test_a_circle_within_one_layer_fails(self):
        problems = self.check(crate(helper_rs="use crate::engine;\n"))
        self.assertOne(problems, "import circle between engine, helper")

    def test_an_import_up_a_layer_fails(self):
        problems = self.check(crate(helper_rs="fn f() { crate::api::Loader; }\n"))
        self.assertHas(problems, "upward import: helper (middle) imports api (top)",
                       "src/helper.rs:2")
        # api -> engine -> helper -> api: the circle it closes, step by step.
        self.assertHas(problems, "import circle between api, engine, helper: api -> engine",
                       "engine -> helper (src/engine.rs:2); helper -> api (src/helper.rs:2)")
        # A module of the top layer that nothing imports: no circle, the layer alone.
        files = crate(lib_rs=LIB + "mod api2;\n", api2_rs="pub struct Other;\n",
                      helper_rs="use crate::api2::Other;\n")
        layers = LAYERS.replace("top: lib api", "top: lib api api2")
        self.assertOne(self.check(files, layers=layers),
                       "upward import: helper (middle) imports api2 (top)")

    def test_an_import_of_the_own_layer_passes(self):
        files = crate()
        c = Crate(files)
        try:
            _, edges = check_structure.imports(check_structure.module_tree(c.root / "src"))
        finally:
            c.close()
        self.assertIn(("engine", "helper"), edges)  # both in the middle layer
        self.assertEqual(self.check(files), [])

    def test_a_path_through_a_root_reexport_counts_as_its_module(self):
        problems = self.check(crate(base_rs="pub struct Error(crate::Loader);\n"))
        self.assertHas(problems, "upward import: base (bottom) imports api (top)", "src/base.rs:2")

    def test_grouped_and_super_paths_count(self):
        grouped = self.check(crate(base_rs="use crate::{helper::{self}, x};\npub struct Error;\n"))
        self.assertHas(grouped, "upward import: base (bottom) imports helper (middle)")
        nested = crate(base_rs="mod inner;\npub struct Error;\n",
                       base__inner_rs="use super::super::api;\n")
        problems = self.check(nested)
        self.assertHas(problems, "upward import: base (bottom) imports api (top)",
                       "src/base/inner.rs:2")

    def test_comments_strings_and_test_code_do_not_count(self):
        base = """\
            //! The base, linked to [`crate::api::Loader`] in docs.
            /// Used by [`crate::api`].
            pub struct Error;
            /* crate::api::Loader, in a block comment */
            const NOTE: &str = "crate::api::Loader";
            const C: char = '"';
            const LATER: &str = r#"crate::api"#;
            #[cfg(test)]
            mod tests {
                use crate::api::Loader;
                fn f() { let _ = "}"; }
            }
            #[cfg(test)]
            use crate::api;
            #[cfg(all(test, unix))]
            mod more_tests;
            """
        files = crate(base_rs=base, base__more_tests_rs="use crate::api::Loader;\n")
        self.assertEqual(self.check(files, rows=[r for r in files if "more_tests" not in r]), [])

    def test_code_after_a_test_module_still_counts(self):
        base = """\
            pub struct Error;
            #[cfg(test)]
            mod tests {
                fn f() -> &'static str { "{" }
            }
            fn g() { crate::api::Loader; }
            """
        problems = self.check(crate(base_rs=base))
        self.assertHas(problems, "upward import: base (bottom) imports api (top)", "src/base.rs:7")

    def test_a_long_file_fails(self):
        long = "pub struct Error;\n" + "// filler\n" * 600
        problems = self.check(crate(base_rs=long))
        self.assertOne(problems, "src/base.rs: 602 lines (at most 600)")
        self.assertEqual(self.check(crate(base_rs="pub struct Error;\n" + "//\n" * 598)), [])

    def test_a_long_test_file_fails_too(self):
        files = crate(base_rs="pub struct Error;\n#[cfg(test)]\nmod tests;\n",
                      base__tests_rs="#[test]\nfn t() {}\n" + "//\n" * 600)
        problems = self.check(files, rows=[r for r in files if "tests" not in r])
        self.assertOne(problems, "src/base/tests.rs", "lines (at most 600)")

    def test_a_long_function_fails(self):
        problems = self.check(crate(base_rs="pub struct Error;\n" + function("long", 81)))
        self.assertOne(problems, "src/base.rs:3 long (81 lines, at most 80)")
        self.assertEqual(self.check(crate(base_rs="pub struct Error;\n" + function("f", 80))), [])
        # Whatever comes before `fn`: visibility, const, async, unsafe, an ABI; a method.
        heads = ['pub fn', 'pub(crate) fn', 'pub(super) const unsafe fn', 'pub async fn',
                 'unsafe extern "C" fn', 'extern "C" fn']
        for head in heads:
            base = "pub struct Error;\n" + function("g", 81, head=head)
            problems = self.check(crate(base_rs=base))
            self.assertOne(problems, "src/base.rs:3 g (81 lines, at most 80)")
        method = "pub struct Error;\nimpl Error {\n" + function("m", 90, "    ", "pub fn") + "}\n"
        self.assertOne(self.check(crate(base_rs=method)), "src/base.rs:4 m (90 lines, at most 80)")

    def test_a_long_function_in_test_code_passes(self):
        in_module = ("pub struct Error;\n#[cfg(test)]\nmod tests {\n    use super::*;\n"
                     + function("t", 200, "    ") + "}\n")
        self.assertEqual(self.check(crate(base_rs=in_module)), [])
        # An item of its own under cfg(test), with attributes after the cfg.
        items = ("pub struct Error;\n#[cfg(test)]\n#[allow(dead_code)]\n" + function("h", 100)
                 + "#[cfg(all(test, unix))]\nimpl Error {\n" + function("m", 100, "    ") + "}\n"
                 + "#[cfg(test)]\npub(crate) trait T {\n" + function("d", 100, "    ") + "}\n")
        self.assertEqual(self.check(crate(base_rs=items)), [])
        # Files of tests by their name or folder, whatever their declaration.
        files = crate(base_rs="pub struct Error;\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\n"
                              "mod more_tests;\n",
                      base__tests_rs=function("t", 200),
                      base__more_tests_rs=function("u", 200),
                      base__tests__deep_rs=function("v", 200))
        self.assertEqual(self.check(files), [])

    def test_a_long_function_after_a_test_item_fails(self):
        # The code after a `#[cfg(test)]` item is built: its function counts.
        for item in ["#[cfg(test)]\nfn helper() {}\n", "#[cfg(test)] fn helper() {}\n",
                     "#[cfg(test)]\nfn helper() {\n    let _ = 1;\n}\n",
                     "#[cfg(test)]\nuse crate::helper;\n", "#[cfg(test)]\nmod tests;\n",
                     "#[cfg(test)]\nconst N: [u8; 2] = [0; 2];\n"]:
            base = "pub struct Error;\n" + item + function("long", 81)
            line = base.count("\n", 0, base.index("fn long")) + 2  # the `//!` line first
            self.assertOne(self.check(crate(base_rs=base)),
                           f"src/base.rs:{line} long (81 lines, at most 80)")
        # A cfg(test) field, statement or match arm hides nothing after it.
        base = ("pub struct Error {\n    #[cfg(test)]\n    pub(crate) x: u8,\n}\n"
                + function("long", 81))
        self.assertOne(self.check(crate(base_rs=base)), "src/base.rs:6 long (81 lines")
        body = "    #[cfg(test)]\n    if true {\n        return;\n    }\n" + "    let _ = 0;\n" * 78
        base = "pub struct Error;\nfn long() {\n" + body + "}\n" + function("next", 81)
        problems = self.check(crate(base_rs=base))
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("src/base.rs:3 long (84 lines, at most 80)", problems[0])
        self.assertIn("src/base.rs:87 next (81 lines, at most 80)", problems[1])

    def test_a_declaration_is_no_function(self):
        filler = "".join(f"    const C{i}: u8 = {i};\n" for i in range(100))
        base = ("pub struct Error;\npub trait Read {\n    fn f(&self);\n"
                "    fn g(\n        &self,\n        at: u64,\n    ) -> u8\n    where\n"
                "        Self: Sized;\n"
                + filler + "    fn h(&self, buf: [u8; 4]) -> [u8; 4];\n" + filler
                + "    fn provided(&self) -> u8 {\n        1\n    }\n}\n"
                "extern \"C\" {\n    fn c_f(x: u8);\n}\n" + filler.replace("const", "static"))
        self.assertEqual(self.check(crate(base_rs=base)), [])

    def test_one_line_functions_end_on_their_line(self):
        # `fn a() {}` ends at once, not at the next `}` of its indentation.
        base = ("pub struct Error;\nimpl Error {\n    fn a() {}\n    pub fn b(&self) -> u8 { 1 }\n"
                + function("c", 79, "    ") + "}\n")
        self.assertEqual(self.check(crate(base_rs=base)), [])

    def test_a_nested_function_is_measured(self):
        inner = function("inner", 81, "    ")
        outer = "fn outer() {\n    let _ = 0;\n" + inner + "    let _ = 1;\n}\n"
        problems = self.check(crate(base_rs="pub struct Error;\n" + outer))
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("src/base.rs:3 outer (85 lines, at most 80)", problems[0])
        self.assertIn("src/base.rs:5 inner (81 lines, at most 80)", problems[1])
        # The outer one counts the inner one's lines; within 80 both pass.
        outer = "fn outer() {\n" + function("inner", 60, "    ") + "    let _ = 1;\n}\n"
        self.assertEqual(self.check(crate(base_rs="pub struct Error;\n" + outer)), [])
        outer = "fn outer() {\n" + function("inner", 78, "    ") + "    let _ = 1;\n}\n"
        self.assertOne(self.check(crate(base_rs="pub struct Error;\n" + outer)),
                       "src/base.rs:3 outer (81 lines, at most 80)")

    def test_fn_in_comments_and_strings_is_no_function(self):
        filler = "// filler\n" * 100
        base = ("pub struct Error;\n/// fn fake() {\n" + filler + "/// }\n"
                "/*\nfn fake2() {\n" + filler + "}\n*/\n"
                'const S: &str = "\nfn fake3() {\n' + filler + '}\n";\n'
                # A string's line that looks like a function, a block after it.
                'const T: (&str, u8) = ("\nfn fake4() {\n", {\n' + "    let _ = 0;\n" * 90
                + "    1\n});\n")
        self.assertEqual(self.check(crate(base_rs=base)), [])

    def test_a_file_without_its_doc_line_fails(self):
        files = crate(base_rs="mod nodoc;\npub struct Error;\n", base__nodoc_rs="fn f() {}\n")
        self.assertOne(self.check(files), "src/base/nodoc.rs: no `//!` line")

    def test_a_module_in_no_layer_fails(self):
        files = crate(lib_rs=LIB + "mod extra;\n", extra_rs="use crate::base;\n")
        self.assertOne(self.check(files), "module `extra` is in no layer")

    def test_the_file_table_matches_the_tree(self):
        files = crate(engine_rs="mod part;\nuse crate::base::Error;\n",
                      engine__part_rs="use crate::helper;\n")
        missing = self.check(files, rows=[r for r in files if r != "engine/part.rs"])
        self.assertOne(missing, "src/engine/part.rs is in no row of the file table")
        folder = self.check(files, rows=["lib.rs", "api.rs", "engine.rs", "engine/", "helper.rs",
                                         "base.rs"])
        self.assertEqual(folder, [])
        gone = self.check(files, rows=list(files) + ["old.rs"])
        self.assertOne(gone, "names src/old.rs, which is gone")

    def test_path_attributes_are_followed(self):
        base = """\
            #[cfg_attr(unix, path = "unix_impl.rs")]
            #[cfg_attr(not(unix), path = "other_impl.rs")]
            mod imp;
            pub struct Error;
            """
        # Relative to the declaring file's directory (src/), both variants read.
        files = crate(base_rs=base,
                      unix_impl_rs="use crate::api;\n",
                      other_impl_rs="use crate::helper;\n")
        problems = self.check(files)
        self.assertHas(problems, "upward import: base (bottom) imports api", "src/unix_impl.rs:2")
        self.assertHas(problems, "upward import: base (bottom) imports helper",
                       "src/other_impl.rs:2")

    def test_the_layers_block_is_required(self):
        with self.assertRaises(SystemExit):
            self.check(crate(), layers="no layers here\n")


class Masking(unittest.TestCase):
    def test_lifetimes_are_not_char_literals(self):
        code = "fn f<'a>(x: &'a str) -> &'a str { crate::base::g(x) }"
        self.assertEqual(check_structure.mask(code, keep_strings=False), code)

    def test_nested_block_comments_end_where_they_close(self):
        code = "/* a /* b */ crate::x */ crate::y"
        masked = check_structure.mask(code, keep_strings=False)
        self.assertNotIn("crate::x", masked)
        self.assertIn("crate::y", masked)
        self.assertEqual(len(masked), len(code))


if __name__ == "__main__":
    unittest.main()
