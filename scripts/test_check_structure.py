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
