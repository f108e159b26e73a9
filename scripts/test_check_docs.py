#!/usr/bin/env python3
"""Tests of scripts/check_docs.py: small source trees and rendered pages it must pass or refuse."""
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_docs  # noqa: E402

SRC = """\
//! The crate.
#[doc(hidden)]
pub mod demo;
#[doc(hidden)]
pub use policy::{AutoPolicy, VARIABLES as ENV_VARIABLES};
pub struct Loader;
impl Loader {
    #[doc(hidden)]
    /// Every option.
    pub fn prefetch_with(self) -> Loader { self }
}
pub struct Report {
    #[doc(hidden)]
    pub queue_path: Option<u8>,
}
"""

PAGE = """<html><body>
<div class="docblock"><p>Use <a href="struct.Loader.html"><code>Loader</code></a>.</p>{extra}</div>
<h2 id="blanket-implementations">Blanket</h2>
<div class="docblock"><a href="dispatcher">from another crate</a> <code>demo</code></div>
</body></html>"""


def tree(root: Path, extra: str = "", example: str = "", doc_line: str = "") -> tuple:
    src = root / "src"
    src.mkdir()
    (src / "lib.rs").write_text(SRC + doc_line)
    doc = root / "doc"
    doc.mkdir()
    (doc / "index.html").write_text(PAGE.format(extra=extra))
    (doc / "struct.Loader.html").write_text(PAGE.format(extra=""))
    examples = root / "examples"
    examples.mkdir()
    (examples / "load.rs").write_text(example)
    return doc, src, examples


def problems(**kw) -> list:
    with tempfile.TemporaryDirectory() as d:
        doc, src, examples = tree(Path(d), **kw)
        hidden = check_docs.hidden_names(src)
        return check_docs.check_pages(doc, hidden) + check_docs.check_sources(
            src, examples, hidden
        )


class CheckDocs(unittest.TestCase):
    def test_hidden_names_are_read_from_the_source(self):
        with tempfile.TemporaryDirectory() as d:
            _, src, _ = tree(Path(d))
            self.assertEqual(
                check_docs.hidden_names(src),
                {"demo", "AutoPolicy", "ENV_VARIABLES", "prefetch_with", "queue_path"},
            )

    def test_clean_docs_pass(self):
        # Other crates' sections (blanket impls) are not the crate's docs.
        self.assertEqual(problems(example="let sd = safeload::Loader::new();\n"), [])

    def test_a_link_to_a_missing_page_is_refused(self):
        found = problems(extra='<a href="struct.PrefetchOptions.html">x</a>')
        self.assertEqual(len(found), 1, found)
        self.assertIn("does not exist", found[0])

    def test_a_link_rustdoc_left_as_written_is_refused(self):
        found = problems(extra='<a href="crate::convert">convert</a>')
        self.assertEqual(len(found), 1, found)
        self.assertIn("could not make", found[0])

    def test_code_naming_a_hidden_item_is_refused(self):
        found = problems(extra="<p>See <code>Loader::prefetch_with</code>.</p>")
        self.assertEqual(len(found), 1, found)
        self.assertIn("prefetch_with", found[0])
        found = problems(extra="<pre><code>let x = safeload::demo::write(d)?;</code></pre>")
        self.assertEqual(len(found), 1, found)

    def test_a_hidden_doc_line_or_an_example_calling_a_hidden_item_is_refused(self):
        found = problems(doc_line="/// # let index = safeload::demo::write(dir.path())?;\n")
        self.assertEqual(len(found), 1, found)
        self.assertIn("hidden line", found[0])
        found = problems(example="let index = safeload::demo::write(dir.path())?;\n")
        self.assertEqual(len(found), 1, found)
        self.assertIn("an example calls hidden demo", found[0])
        # The same words outside a `safeload::` path are not a call.
        self.assertEqual(problems(example="// a demo checkpoint\nlet demo = 1;\n"), [])


if __name__ == "__main__":
    unittest.main()
