"""Each app reads its settings in one place, its conf.py (issue 9, point 5): no other module
of the app touches django.conf.settings, and each conf reads only the settings it defines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.processes import PROJECT_ROOT

APPS = ("canonical_ids", "jobs", "inbound_email", "notifications", "ops", "processes")
# Django's own settings, not an app's: a model's foreign key to the user model is the
# swappable reference; qcluster touches SECRET_KEY to refuse to start without one.
ALLOWED_OUTSIDE_CONF = {"AUTH_USER_MODEL", "SECRET_KEY"}


def _settings_reads(path: Path) -> set[str]:
    """Names read as `settings.X` or `getattr(settings, "X", ...)` in a module that imports
    django.conf.settings."""
    tree = ast.parse(path.read_text())
    imports_settings = any(
        isinstance(node, ast.ImportFrom)
        and node.module == "django.conf"
        and any(alias.name == "settings" for alias in node.names)
        for node in ast.walk(tree)
    )
    if not imports_settings:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "settings":
            names.add(node.attr)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "getattr"
            and getattr(node.args[0], "id", None) == "settings"
            and isinstance(node.args[1], ast.Constant)
        ):
            names.add(node.args[1].value)
    return names


@pytest.mark.parametrize("app", APPS)
def test_only_the_apps_conf_reads_settings(app):
    offenders = {}
    for path in sorted((PROJECT_ROOT / app).rglob("*.py")):
        relative = path.relative_to(PROJECT_ROOT)
        if "migrations" in relative.parts or relative.name == "conf.py":
            continue
        reads = _settings_reads(path) - ALLOWED_OUTSIDE_CONF
        if reads:
            offenders[str(relative)] = sorted(reads)
    assert offenders == {}


def _setting_names_in_conf(path: Path) -> set[str]:
    """Upper-case string constants passed to a reader: `_int("X", …)`, `getattr(settings, "X")`."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            for arg in node.args[:2]:
                if (
                    isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str)
                    and arg.value.isupper()
                    and arg.value.replace("_", "").isalnum()
                ):
                    names.add(arg.value)
    return names


@pytest.mark.parametrize("app", APPS)
def test_every_setting_a_conf_reads_is_defined_by_the_project(app, settings):
    """A typo in a conf would silently read the default instead of the operator's value."""
    names = _setting_names_in_conf(PROJECT_ROOT / app / "conf.py")
    assert names, f"{app}/conf.py reads no settings"
    assert sorted(name for name in names if not hasattr(settings, name)) == []
