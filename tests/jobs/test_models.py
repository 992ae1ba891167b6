"""The Job table refuses rows the job loop could never handle, whoever inserts them.

The web app and the Slack bot insert jobs with plain SQL (docs/jobs.md), so the table's
check constraints, not enqueue(), are what stands between an odd value and the loop: a row
the runner, the reaper, worker_status or the admin cannot read or act on must fail its
INSERT, with the rule's name, at the producer that wrote it.
"""

from __future__ import annotations

import psycopg
import pytest
from django.urls import reverse

from jobs.models import Job
from jobs.runner import run_pending
from ops.status import worker_status
from tests.support.wakeup import raw_connection

pytestmark = pytest.mark.django_db(transaction=True)

_COLUMNS = {
    "kind": "'tests.noop'",
    "payload": "'{}'",
    "status": "'queued'",
    "priority": "0",
    "attempts": "0",
    "max_attempts": "3",
    "run_after": "now()",
    "created_at": "now()",
    "locked_by": "''",
    "last_error": "''",
}


def _plain_insert(**overrides: str) -> None:
    """A foreign producer's INSERT with SQL literals for some columns."""
    values = {**_COLUMNS, **overrides}
    with raw_connection() as conn:
        conn.execute(
            f"INSERT INTO jobs_job ({', '.join(values)}) VALUES ({', '.join(values.values())})"
        )


@pytest.mark.parametrize(
    "run_after", ["'-infinity'", "'4713-01-01 BC'", "'infinity'", "'20000-01-01'"]
)
def test_a_run_after_python_cannot_read_is_refused_and_the_queue_keeps_working(
    admin_client, run_after
):
    """A due row dated '-infinity' made every claim fail (psycopg cannot load it), so no job
    ran, and worker_status and the admin's job list answered with an error."""
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_job_run_after_in_range"):
        _plain_insert(run_after=run_after)
    with pytest.raises(psycopg.errors.CheckViolation, match="jobs_job_created_at_in_range"):
        _plain_insert(created_at=run_after)
    _plain_insert()

    assert run_pending().completed == 1
    assert not worker_status().needs_operator
    assert admin_client.get(reverse("admin:jobs_job_changelist")).status_code == 200


@pytest.mark.parametrize(
    ("overrides", "rule"),
    [
        ({"status": "'QUEUED'"}, "jobs_job_status_known"),
        ({"status": "'pending'"}, "jobs_job_status_known"),
        ({"max_attempts": "0"}, "jobs_job_max_attempts_positive"),
        ({"status": "'processing'", "attempts": "1"}, "jobs_job_processing_has_lease"),
        ({"payload": "'null'"}, "jobs_job_payload_is_object"),
        ({"payload": "'[1, 2]'"}, "jobs_job_payload_is_object"),
        ({"payload": "'\"text\"'"}, "jobs_job_payload_is_object"),
    ],
)
def test_a_row_the_loop_would_never_run_nor_report_is_refused_naming_the_rule(overrides, rule):
    """Before: a status the loop does not know, max_attempts 0, or `processing` without a
    lease was neither claimed, reaped, failed nor reported by worker_status: a job kept
    forever with nobody told. A payload that is not an object reached handlers typed
    `payload: dict` and was retried as if the failure were transient."""
    with pytest.raises(psycopg.errors.CheckViolation, match=rule):
        _plain_insert(**overrides)
    assert not Job.objects.exists()
