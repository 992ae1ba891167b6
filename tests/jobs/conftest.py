from __future__ import annotations

import pytest

import tests.jobs.handlers  # noqa: F401 - registers the test handlers in this process


@pytest.fixture
def worker_env(subprocess_env):
    """Environment of a `manage.py run_jobs` / `reap_stale` child on the test database."""
    env = dict(subprocess_env)
    env["JOBS_EXTRA_HANDLER_MODULES"] = "tests.jobs.handlers"
    return env


@pytest.fixture(autouse=True)
def no_kind_known_slow():
    """Each test's database starts with no job durations: this process's cached slow kinds
    (jobs.slow_kinds, issue 29) must not carry another test's over."""
    from jobs.conf import get_config
    from jobs.slow_kinds import slow_kinds

    slow_kinds.known([], hold=get_config().hold_unstarted_seconds)
    yield
    slow_kinds.forget()


@pytest.fixture
def one_slot(settings, worker_env):
    """The one-slot drain (JOBS_CONCURRENCY=1), in this process and in the `run_jobs` /
    `reap_stale` children: each job on the drain's thread, from a batch of
    JOBS_CLAIM_BATCH_SIZE taken in turn. What a test using it pins (the statements of such a
    batch, the keeper giving back its unstarted claims behind a long job, a completion
    flushed before the next job of the batch) is that drain's; with slots (the default
    since issue 37) every claimed job starts at once and tests/jobs/test_slots.py holds."""
    settings.JOBS_CONCURRENCY = 1
    worker_env["JOBS_CONCURRENCY"] = "1"
