"""ops/checks.py: the database check runs when a command asks for the database, and passes on
a reachable one (the unreachable cases, one line each: tests/project/test_cli.py)."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks


@pytest.mark.django_db
def test_the_database_check_passes_on_a_reachable_database():
    assert [m for m in run_checks(databases=["default"]) if m.id and m.id.startswith("ops.")] == []


def test_the_database_check_does_not_connect_unless_asked(monkeypatch):
    """makemigrations, collectstatic (the image build) run the checks with no database."""
    import psycopg

    def refuse(*args, **kwargs):
        raise psycopg.OperationalError("connected")

    monkeypatch.setattr(psycopg, "connect", refuse)
    assert [m for m in run_checks() if m.id and m.id.startswith("ops.")] == []
    assert [m.id for m in run_checks(databases=["default"])] == ["ops.E002"]
