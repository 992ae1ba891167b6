"""Shared fixtures. Tests run on PostgreSQL (DATABASE_URL); see scripts/test."""

from __future__ import annotations

import pytest
from django.conf import settings

pytest_plugins = ["tests.support.browser"]


def pytest_configure(config: pytest.Config) -> None:
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        raise pytest.UsageError(
            "The tests run on PostgreSQL: set "
            "DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker "
            "(scripts/test does this for you)."
        )


@pytest.fixture
def subprocess_env(transactional_db) -> dict[str, str]:
    """Environment for a child `manage.py` / python process that must see the *test* database.

    pytest-django renames the database to test_<name>; a subprocess reading DATABASE_URL would
    otherwise open the dev database. Use with transaction=True tests so rows are committed.
    """
    from tests.support.processes import child_env

    return child_env()
