"""Fixtures of the processes tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def worker_env(subprocess_env):
    """A `manage.py run_jobs` / qcluster child on the test database with the test handlers,
    beating every 0.3 s (so "gone after 3 silent beats" is a second away)."""
    return {
        **subprocess_env,
        "JOBS_EXTRA_HANDLER_MODULES": "tests.jobs.handlers",
        "PROCESS_HEARTBEAT_SECONDS": "0.3",
        "JOBS_POLL_SECONDS": "0.2",
    }
