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


@pytest.fixture(autouse=True)
def no_process_beacon_outlives_its_test():
    """A beat thread left running in the test process re-registers its row after every
    flush (its row "vanished") and shows as a live process in later tests — it did, from a
    test that sent django-q2's post_spawn. Stop it, and fail the test that left it."""
    yield
    import threading

    from processes import beacon

    leaked = [t.name for t in threading.enumerate() if t.name.startswith("process-beacon-")]
    if beacon._beacon is not None:
        beacon._beacon.stop()
        beacon._beacon = None
    if leaked:
        pytest.fail(f"the test left process beat threads running: {leaked}")


@pytest.fixture(autouse=True)
def no_claim_floor():
    """Each test starts with a full scan: this process's claim floor (jobs.claim_floor,
    issue 32) may have been raised by another test's clock, above the rows this one back-dates."""
    from jobs.claim_floor import claim_floor

    claim_floor.forget()
    yield
    claim_floor.forget()
