"""The docs name tests that exist, and the commands they write work.

docs/architecture.md and the app pages prove each invariant and defect fix by naming tests.
A test renamed or moved without its docs leaves the reader a proof that is not there, so
every test reference in README.md and docs/*.md must resolve to a file and a test function in
it.

Every command README.md and docs/*.md write (issue 31.8, the reference moved from the README
into docs/) must still be one a reader can paste: `manage.py <command> [options]` names a
management command whose parser accepts the options written (placeholders such as N or NAME
filled with a value of the option's type; a bare `manage.py <command>` only names it),
`python -m <module>` names an importable module, and `scripts/…`, `bench/….py` and `.ci/run`
exist (a benchmark's `--options` in its source).

A reference is a backticked code span: `tests/<dir>/test_x.py::test_name` (full),
`test_x.py::test_name` or a bare `test_x.py` (relative to the last full path in the same
paragraph, table row or list item, else to tests/<page>/ on an app page), `::test_name` (in
the last file named before it), and `*` wildcards in the file or the name
(`tests/jobs/*::test_cor17_*`), which must match at least one test. Test files are read with
`ast`, not collected.
"""

from __future__ import annotations

import ast
import importlib.util
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


def _pages() -> list[Path]:
    pages = sorted((PROJECT_ROOT / "docs").glob("*.md"))
    assert pages, "no docs/*.md found"
    return [PROJECT_ROOT / "README.md", *pages]


def test_every_test_the_docs_name_exists():
    missing = [
        f"{page.relative_to(PROJECT_ROOT)} {problem}"
        for page in _pages()
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


# --- the commands the docs write -------------------------------------------------------------

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
MANAGE = re.compile(r"manage\.py\s+([a-z_]+)(?![\w/])((?:\s+[^\s#&;]+)*)")
MODULE = re.compile(r"python3?\s+-m\s+([\w.]+)")
PATHS = re.compile(r"(?<![\w/.])((?:scripts|bench)/[\w.-]+|\.ci/run)((?:\s+--?[\w-]+)*)")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*$|^…$")


def documented_commands(text: str) -> list[tuple[int, str]]:
    """(line number, command text) of each code span and each line of a fenced block."""
    found: list[tuple[int, str]] = []
    for block in FENCE.finditer(text):
        first = text.count("\n", 0, block.start(1)) + 1
        found += [(first + i, line) for i, line in enumerate(block[1].splitlines())]
    outside = FENCE.sub(lambda m: "\n" * m[0].count("\n"), text)
    for number, line in enumerate(outside.splitlines(), 1):
        found += [(number, span) for span in SPAN.findall(line)]
    return found


def _arguments(raw: str) -> list[str]:
    """`[--sweep a|b] [--older-than S]` -> ["--sweep", "a", "--older-than", "S"]."""
    words = raw.replace("[", " ").replace("]", " ").split()
    return [word.split("|", 1)[0] for word in words if word not in {"|", "…"}]


def _filled(parser, args: list[str]) -> list[str]:
    """Placeholders (N, S, NAME) replaced by a value the option's action accepts."""
    actions = {flag: action for action in parser._actions for flag in action.option_strings}
    filled: list[str] = []
    for arg in args:
        action = actions.get(filled[-1]) if filled else None
        if PLACEHOLDER.match(arg) and action is not None:
            if action.choices:
                arg = str(next(iter(action.choices)))
            elif action.type in (int, float):
                arg = "1"
            else:
                arg = "x"
        filled.append(arg)
    return filled


def broken_commands(text: str, *, root: Path) -> list[str]:
    """Each command in `text` that would not run as written, with its line and why."""
    from django.core.management import get_commands, load_command_class
    from django.core.management.base import CommandError

    commands = get_commands()
    broken: list[str] = []
    for number, line in documented_commands(text):
        for match in MANAGE.finditer(line):
            name, args = match[1], _arguments(match[2])
            if name not in commands:
                broken.append(f"line {number}: manage.py {name}: no such command")
                continue
            if not args:
                continue  # a bare name refers to the command (its required options aside)
            parser = load_command_class(commands[name], name).create_parser("manage.py", name)
            try:
                parser.parse_args(_filled(parser, args))
            except (CommandError, SystemExit) as exc:
                broken.append(f"line {number}: manage.py {name} {' '.join(args)}: {exc}")
        for match in MODULE.finditer(line):
            if importlib.util.find_spec(match[1]) is None:
                broken.append(f"line {number}: python -m {match[1]}: no such module")
        for match in PATHS.finditer(line):
            path = root / match[1]
            if not path.exists():
                broken.append(f"line {number}: {match[1]} does not exist")
                continue
            source = path.read_text(encoding="utf-8") if path.is_file() else ""
            for option in match[2].split():
                if option.startswith("--") and option not in source:
                    broken.append(f"line {number}: {match[1]} has no {option}")
    return broken


def test_every_command_the_docs_write_works():
    broken = [
        f"{page.relative_to(PROJECT_ROOT)} {problem}"
        for page in _pages()
        for problem in broken_commands(page.read_text(encoding="utf-8"), root=PROJECT_ROOT)
    ]
    assert broken == [], "docs write commands that do not work:\n" + "\n".join(broken)


def test_the_command_check_reports_each_kind_of_broken_command(tmp_path):
    """The check itself: a renamed command, an option it does not take, a missing module,
    script or benchmark option are each reported; commands as the docs write them pass."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "run-worker").write_text("#!/bin/sh\n")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "mint.py").write_text('parser.add_argument("--processes")\n')
    text = "\n".join(
        [
            "| ok | `manage.py reap_stale [--dry-run] [--older-than S]` |",
            "| ok | `python manage.py run_sweeps --once [--sweep new_proposal|digest]` |",
            "| ok | `python -m project.embedded_pg start`, `scripts/run-worker` |",
            "| a name | `manage.py mint_messages` (options aside), `manage.py  project/` |",
            "| ok | `DATABASE_URL=… .venv/bin/python bench/mint.py --processes 4` |",
            "| renamed | `manage.py reap_old --dry-run` |",
            "| option | `manage.py worker_status --yaml` |",
            "| module | `python -m project.embedded_postgres stop` |",
            "| script | `scripts/start-worker` |",
            "| bench option | `bench/mint.py --threads 4` |",
            "",
            "```sh",
            ".venv/bin/python manage.py qcluster --workers 3   # a comment",
            "```",
        ]
    )
    problems = broken_commands(text, root=tmp_path)
    assert [p.split(":", 1)[0] for p in problems] == [
        "line 13",  # fenced blocks are read first
        "line 6",
        "line 7",
        "line 8",
        "line 9",
        "line 10",
    ], problems
    assert "no such command" in problems[1] and "--yaml" in problems[2]
    assert "no such module" in problems[3] and "does not exist" in problems[4]
    assert "has no --threads" in problems[5]
