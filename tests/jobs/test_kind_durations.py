"""Issue 36.7: the runner reads the durations it needs without reaching up into the
console's app. ops imports jobs, never the reverse: jobs/kind_durations.py reads ops'
per-kind duration tables by name, with a copy of the bucket bounds ops' trigger uses."""

from __future__ import annotations

import ast

from django.apps import apps

from jobs import kind_durations
from ops import job_periods
from tests.support.processes import PROJECT_ROOT


def _imports(tree: ast.AST) -> set[str]:
    """Every module a file imports, at its top or inside a function alike."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_no_module_of_jobs_imports_ops():
    """Not even inside a function: jobs/slow_kinds.py imported ops.selectors there."""
    found = {}
    for path in sorted((PROJECT_ROOT / "jobs").rglob("*.py")):
        reaching_up = sorted(
            name
            for name in _imports(ast.parse(path.read_text(), filename=str(path)))
            if name == "ops" or name.startswith("ops.")
        )
        if reaching_up:
            found[str(path.relative_to(PROJECT_ROOT))] = reaching_up
    assert found == {}


def test_the_read_uses_the_bounds_and_tables_ops_writes():
    """The copy of the bounds is ops' (its trigger's buckets), and the tables are ops'."""
    assert kind_durations.DURATION_BOUNDS == job_periods.DURATION_BOUNDS
    assert kind_durations._tables() == (
        apps.get_model("ops", "JobPeriod")._meta.db_table,
        apps.get_model("ops", "JobPeriodDelta")._meta.db_table,
    )
