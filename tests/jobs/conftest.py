from __future__ import annotations

import pytest

import tests.jobs.handlers  # noqa: F401 - registers the test handlers in this process


@pytest.fixture
def worker_env(subprocess_env):
    """Environment of a `manage.py run_jobs` / `reap_stale` child on the test database."""
    env = dict(subprocess_env)
    env["JOBS_EXTRA_HANDLER_MODULES"] = "tests.jobs.handlers"
    return env
