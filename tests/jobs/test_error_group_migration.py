"""Migration jobs 0008 keys the failed rows already there (issue 20, the error groups read a
stored key): after it, every failed row written before it is in the group of the same
failures written after it."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone
from model_bakery import baker

from jobs.error_groups import job_error_groups, jobs_in_error_group
from jobs.models import Job

BEFORE = [("jobs", "0007_job_counts")]


def _migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def _migrate_to_latest() -> None:
    """Back to every app's latest migration, not just 0008: the later ones (the runner's
    function, other apps' triggers on jobs_job) were unapplied with the step back, and the
    tests after this one need them."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_the_migration_keys_the_failed_rows_written_before_it():
    _migrate(BEFORE)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
                "locked_by, last_error, failed_at, run_after, created_at) "
                "SELECT 'report.render', '{}', 'failed', 0, 1, 1, '', "
                "'ValueError: user ' || i || ' not found', now(), now(), now() "
                "FROM generate_series(1, 3) AS i"
            )
            cursor.execute(
                "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
                "locked_by, last_error, run_after, created_at) VALUES ('report.render', '{}', "
                "'queued', 0, 0, 1, '', 'ValueError: user 5 not found', now(), now())"
            )
            cursor.execute("SELECT id FROM jobs_job WHERE status = 'failed'")
            failed = {row[0] for row in cursor.fetchall()}
    finally:
        _migrate_to_latest()
    # A job failing after the migration with the same error joins the same group.
    later = baker.make(
        Job,
        kind="report.render",
        status=Job.Status.FAILED,
        attempts=1,
        max_attempts=1,
        failed_at=timezone.now(),
        last_error="ValueError: user 9 not found",
    )
    (group,) = job_error_groups()
    assert (group.kind, group.exception, group.message, group.count) == (
        "report.render",
        "ValueError",
        "user N not found",
        4,
    )
    assert set(jobs_in_error_group(group.key).values_list("pk", flat=True)) == failed | {later.pk}
