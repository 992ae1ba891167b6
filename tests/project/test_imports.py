"""Our modules import without error and without a cycle (issue 9).

A cycle among module-level imports works or breaks depending on which module is imported
first, so it is found from the source (`ast`), not by luck of the import order. Imports
inside functions are not edges: they run later, and each one carries a comment saying why it
is there (an import that would otherwise touch the models before the app registry is ready).
"""

from __future__ import annotations

import ast
import json
from graphlib import CycleError, TopologicalSorter

from tests.support.processes import PROJECT_ROOT, django_python

APPS = ("canonical_ids", "jobs", "inbound_email", "notifications", "ops", "processes", "project")


def _our_modules() -> dict[str, ast.Module]:
    """Every module of our apps (migrations left out: only `migrate` imports them)."""
    modules = {}
    for app in APPS:
        for path in sorted((PROJECT_ROOT / app).rglob("*.py")):
            parts = path.relative_to(PROJECT_ROOT).with_suffix("").parts
            if "migrations" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = ast.parse(path.read_text(), filename=str(path))
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_statements(body: list[ast.stmt]):
    """The statements that run when the module is imported: not function bodies, not
    `if TYPE_CHECKING:` blocks; class bodies, `try` and other `if` blocks included."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        yield node
        if isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _import_time_statements(node.body)
            yield from _import_time_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _import_time_statements(block)
            for handler in node.handlers:
                yield from _import_time_statements(handler.body)
        elif isinstance(node, ast.ClassDef | ast.With):
            yield from _import_time_statements(node.body)


def _imported(module: str, is_package: bool, node: ast.stmt, ours: set[str]) -> set[str]:
    """Which of our modules `node` imports (a `from X import name` imports X, and X.name if
    that is a module)."""
    targets: set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            name = alias.name
            while name and name not in ours:
                name = name.rpartition(".")[0]
            if name:
                targets.add(name)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = module if is_package else module.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{base}" if base else package
        if base in ours:
            targets.add(base)
        targets.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in ours)
    return targets


def import_graph() -> dict[str, set[str]]:
    modules = _our_modules()
    ours = set(modules)
    packages = {
        name for name in ours if (PROJECT_ROOT / name.replace(".", "/") / "__init__.py").exists()
    }
    graph = {}
    for name, tree in modules.items():
        edges = set()
        for node in _import_time_statements(tree.body):
            edges |= _imported(name, name in packages, node, ours)
        graph[name] = edges - {name}
    return graph


def test_the_import_graph_sees_our_imports():
    """The check below is only as good as the graph: spot-check edges we know exist."""
    graph = import_graph()
    assert "inbound_email.parsing" in graph["inbound_email.services.intake"]
    assert "inbound_email.parse_limits" in graph["inbound_email.parsing"]
    assert "jobs.models" in graph["jobs.runner_step"]
    # imports inside functions and under TYPE_CHECKING do not run at import time
    assert "jobs.runner" not in graph["jobs"]
    assert "canonical_ids.models" not in graph["canonical_ids"]


def test_no_import_cycle_among_our_modules():
    graph = import_graph()
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as error:
        cycle = " imports ".join(reversed(error.args[1]))
        raise AssertionError(f"module-level import cycle: {cycle}") from None


def _last_json_line(code: str):
    """Run `code` in a fresh process after django.setup(); its last line, as JSON."""
    result = django_python(code, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_every_module_imports_in_a_fresh_process():
    """A name moved or removed by a refactoring fails here, in a process that has imported
    nothing of ours but what django.setup() loads."""
    names = sorted(import_graph())
    script = (
        "import importlib, json, traceback\n"
        "failed = {}\n"
        f"for name in {names!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception:\n"
        "        failed[name] = traceback.format_exc(limit=3)\n"
        "print(json.dumps(failed))\n"
    )
    failed = _last_json_line(script)
    assert failed == {}, "\n".join(failed.values())
    assert len(names) > 90  # every app was found


def test_a_process_that_makes_no_s3_or_slack_call_does_not_import_their_sdks():
    """boto3 with botocore and slack-sdk cost about 0.19 s of CPU to import: every `manage.py`
    command, qcluster and web worker paid it at start-up through the admin and the job
    handlers, though most never call S3 (a folder store) or Slack (off by default). They are
    imported when the S3 store or a Slack post is first used."""
    script = (
        "import json, sys\n"
        "import project.urls\n"
        "from jobs import registry\n"
        "registry.discover()\n"
        "from inbound_email.stores import default_store\n"
        "default_store()\n"
        "heavy = ('boto3', 'botocore', 'slack_sdk')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    assert _last_json_line(script) == []
