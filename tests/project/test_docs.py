"""The docs name tests that exist.

docs/architecture.md and the app pages prove each invariant and defect fix by naming tests.
A test renamed or moved without its docs leaves the reader a proof that is not there, so
every test reference in docs/*.md must resolve to a file and a test function in it.

A reference is a backticked code span: `tests/<dir>/test_x.py::test_name` (full),
`test_x.py::test_name` or a bare `test_x.py` (relative to the last full path in the same
paragraph, table row or list item, else to tests/<page>/ on an app page), `::test_name` (in
the last file named before it), and `*` wildcards in the file or the name
(`tests/jobs/*::test_cor17_*`), which must match at least one test. Test files are read with
`ast`, not collected.
"""

from __future__ import annotations

import ast
import re
from fnmatch import fnmatchcase
from functools import cache
from pathlib import Path

from tests.support.processes import PROJECT_ROOT

BLOCK_STARTS = ("|", "#", "- ", "* ", "1. ")
SPAN = re.compile(r"`([^`\n]+)`")
REFERENCE = re.compile(
    r"^(?P<file>tests/[\w*./]+|[\w*]*test[\w*]*\.py)?(?:::(?P<name>(?:Test\w*::)?test[\w*]*))?$"
)


@cache
def _test_names(path: Path) -> frozenset[str]:
    """The test functions pytest would collect from `path` (module level and in Test* classes)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names.update(
                f"{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            )
    return frozenset(name for name in names if name.rsplit("::", 1)[-1].startswith("test"))


def _files(pattern: str, root: Path) -> list[Path]:
    if "*" not in pattern:
        return [root / pattern] if (root / pattern).is_file() else []
    if not pattern.endswith(".py"):
        pattern += ".py" if pattern.endswith("*") else "/*.py"
    return sorted(path for path in root.glob(pattern) if path.name.startswith("test_"))


def missing_references(text: str, *, default_dir: str | None, root: Path) -> list[str]:
    """Each reference in `text` that names no existing test file or test, with its line."""
    missing: list[str] = []
    directory, file = default_dir, None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith(BLOCK_STARTS):
            directory, file = default_dir, None  # a new paragraph, table row or list item
        for span in SPAN.findall(line):
            match = REFERENCE.match(span.strip())
            if not match or not (match["file"] or match["name"]):
                continue
            ref_file, name = match["file"], match["name"]
            if ref_file:
                if ref_file.startswith("tests/"):
                    file = ref_file
                    directory = ref_file.rsplit("/", 1)[0]
                elif directory is None:
                    missing.append(f"line {number}: `{span}` (no tests/<dir>/ before it)")
                    continue
                else:
                    file = f"{directory}/{ref_file}"
            elif file is None:
                missing.append(f"line {number}: `{span}` (no file named before it)")
                continue
            if file.endswith("/") and name is None:  # a folder: `tests/support/`
                if not (root / file).is_dir():
                    missing.append(f"line {number}: `{span}` ({file} does not exist)")
                continue
            paths = _files(file, root)
            if not paths:
                missing.append(f"line {number}: `{span}` ({file} does not exist)")
                continue
            if name is None:
                continue
            known = set().union(*(_test_names(path) for path in paths))
            if not any(fnmatchcase(test, name) for test in known):
                missing.append(f"line {number}: `{span}` (no {name} in {file})")
    return missing


def _default_dir(page: Path) -> str | None:
    directory = f"tests/{page.stem}"
    return directory if (PROJECT_ROOT / directory).is_dir() else None


def test_every_test_the_docs_name_exists():
    pages = sorted((PROJECT_ROOT / "docs").glob("*.md"))
    assert pages, "no docs/*.md found"
    missing = [
        f"docs/{page.name} {problem}"
        for page in pages
        for problem in missing_references(
            page.read_text(encoding="utf-8"), default_dir=_default_dir(page), root=PROJECT_ROOT
        )
    ]
    assert missing == [], "docs name tests that do not exist:\n" + "\n".join(missing)


def test_the_check_reports_each_kind_of_dangling_reference(tmp_path):
    """The check itself: a renamed test, a moved file, a dead wildcard and an orphan `::name`
    are each reported; existing names, bare files and live wildcards pass."""
    app = tmp_path / "tests" / "app"
    app.mkdir(parents=True)
    (app / "test_one.py").write_text(
        "def test_kept():\n    pass\n\n\ndef test_v4_sends_once():\n    pass\n\n\n"
        "class TestGroup:\n    def test_inside(self):\n        pass\n",
        encoding="utf-8",
    )
    text = "\n".join(
        [
            "| ok | `tests/app/test_one.py::test_kept`, `::test_v4_*`, `test_one.py` |",
            "| ok | `test_one.py::TestGroup::test_inside`, `tests/app/*::test_kept` |",
            "| renamed | `tests/app/test_one.py::test_gone` |",
            "| moved | `tests/app/test_two.py::test_kept` |",
            "| dead wildcard | `tests/app/*::test_cor19_*` |",
            "| orphan | `::test_kept` |",
            "| not a test | `app/services.py`, `python manage.py test` |",
            "| folders | `tests/app/`, `tests/gone/` |",
            "",
            "A paragraph: `tests/app/test_one.py::test_kept`, wrapped, and then",
            "`::test_v4_sends_once` in the same file.",
        ]
    )
    assert missing_references(text, default_dir="tests/app", root=tmp_path) == [
        "line 3: `tests/app/test_one.py::test_gone` (no test_gone in tests/app/test_one.py)",
        "line 4: `tests/app/test_two.py::test_kept` (tests/app/test_two.py does not exist)",
        "line 5: `tests/app/*::test_cor19_*` (no test_cor19_* in tests/app/*)",
        "line 6: `::test_kept` (no file named before it)",
        "line 8: `tests/gone/` (tests/gone/ does not exist)",
    ]
