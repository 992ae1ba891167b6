"""The longest tests start first (issue 36, point 6: a test command one can wait for).

pytest-xdist's `--dist loadgroup` hands the tests to the workers one by one in collection
order (the order pytest-randomly shuffled, then pytest-django's grouping). A test of two or
three minutes handed out near the end keeps one worker busy while the others are done: in a
whole run that tail was minutes. Moved to the front, the long ones overlap each other and
the short ones fill in behind them (longest first, the classic rule for this scheduling).

Only the position of the tests in LONG changes; their own order among themselves, and
everyone else's, stays the seed's. Moving transactional tests before the others is safe
here: no migration inserts rows, so a flushed database is the migrated one (pytest-django
orders them last for Django's TestCase, which these tests do not use).

LONG lists node id prefixes of tests over about 30 s on a quiet 2-core machine
(`scripts/test ... --durations=60` shows them); a new long test is added here.
Registered by tests/conftest.py.
"""

from __future__ import annotations

import pytest

LONG = (
    "tests/faults/",  # one xdist group (tests/faults/conftest.py): about 90 s on one worker
    "tests/system/test_chaos.py",
    "tests/inbound_email/test_poller.py::test_1001_objects_in_one_run_paginate_past_1000",
    "tests/ops/test_console_browser.py",
    "tests/jobs/test_rolling_deploy.py",
    "tests/system/test_outage.py",
    "tests/system/test_qcluster_system.py",
    "tests/jobs/test_invariants.py",
    "tests/project/test_test_script.py",
    "tests/jobs/test_tasks.py::test_a_job_committed_while_the_cluster_runs_starts_within",
    "tests/notifications/test_ses_events_input.py",
    "tests/ops/test_rollup_ticker.py",
    "tests/ops/test_task_guard.py::test_a_hostile_schedule_inserted_by_sql",
    "tests/notifications/test_sns_certificates.py::test_a_certificate_larger_than_the_cap",
    "tests/project/test_run_worker.py",
    "tests/notifications/test_senders.py",
    "tests/jobs/test_admin.py::test_retry_now_and_cancel_act_on_thousands_of_rows",
    "tests/jobs/test_concurrency.py",
    # 1,000,000 rows inserted and vacuumed: 31.6 s beside test_concurrency.py's 47.4 s (load 12).
    "tests/jobs/test_kind_cap_backlog.py::test_a_capped_kinds_million_queued_rows",
    "tests/project/test_embedded_pg.py",
    "tests/ops/test_demo.py",
    "tests/project/test_embedded_pg_system_dir.py",
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """After pytest-randomly's shuffle and pytest-django's grouping: LONG first, stably."""
    items.sort(key=lambda item: not item.nodeid.startswith(LONG))
