"""Failed jobs grouped by kind, exception class and normalised message (issue 20).

A group is read from `last_error`'s first line ("ExceptionClass: message", as
outcomes.format_error writes it): numbers become N, long hex runs (ids, hashes) X, quoted
text '…', so "user 41 not found" and "user 97 not found" are one group. A group's key is the
md5 of kind, class and normalised message, stored in `error_group` by the database's trigger
(jobs migration 0008, which also defines the SQL functions jobs_error_class and
jobs_error_message used here), so the page groups an index instead of running regexps over
every failed row, and the admin's list filter, "Retry all" and "Cancel all" select by the
same column: a group's link and its actions cannot disagree.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlencode

from django.db import connection
from django.db.models import QuerySet
from django.urls import reverse

from jobs.models import Job
from jobs.operator_actions import jobs_cancel, jobs_retry_now

logger = logging.getLogger(__name__)
TABLE = Job._meta.db_table
GROUPS_LISTED = 100
SAMPLE_CHARS = 1000  # of a group's sample error (the rest is on the job's page)


@dataclass(frozen=True)
class ErrorGroup:
    key: str
    kind: str
    exception: str
    message: str
    count: int
    first_seen: datetime | None
    last_seen: datetime | None
    # The newest member's error as it was written, before the traceback: the normalised
    # message hides the KeyError's key and the constraint's name, which an operator needs.
    sample: str = ""


_GROUPS_SQL = f"""
WITH g AS (
    SELECT error_group, count(*) AS n, min(failed_at) AS first_seen,
           max(failed_at) AS last_seen, max(id) AS one_id
    FROM {TABLE} WHERE status = %(failed)s {{only}} GROUP BY error_group
    ORDER BY n DESC, last_seen DESC NULLS LAST, error_group LIMIT %(limit)s
)
SELECT g.error_group, one.kind, jobs_error_class(one.last_error),
       jobs_error_message(one.last_error), g.n, g.first_seen, g.last_seen,
       left(split_part(one.last_error, E'\\n\\n', 1), %(sample)s)
FROM g JOIN {TABLE} AS one ON one.id = g.one_id
ORDER BY g.n DESC, g.last_seen DESC NULLS LAST, g.error_group
"""


def job_error_groups(*, limit: int = GROUPS_LISTED) -> list[ErrorGroup]:
    """The groups of jobs failed for good, largest first.

    Count, first and last seen and one member's id come from one pass over the partial index
    jobs_job_error_group_idx (error_group, failed_at, id); kind, class and message are then
    read from that one row of each listed group, by primary key: the cost follows the number
    of failed rows, never (groups x rows). That row's error, up to the blank line before its
    traceback (`outcomes.format_error`: the message, and psycopg's DETAIL line with it), is
    the group's sample."""
    return _read_groups(only="", limit=limit)


def job_error_group(*, key: str) -> ErrorGroup | None:
    """One group, as the list shows it (None once none of its jobs is failed any more): what
    the confirmation of its "Cancel all" names."""
    groups = _read_groups(only="AND error_group = %(key)s", limit=1, key=key)
    return groups[0] if groups else None


def _read_groups(*, only: str, limit: int, **params: str) -> list[ErrorGroup]:
    with connection.cursor() as cursor:
        cursor.execute(
            _GROUPS_SQL.format(only=only),
            {"failed": Job.Status.FAILED, "limit": limit, "sample": SAMPLE_CHARS, **params},
        )
        return [ErrorGroup(*row) for row in cursor.fetchall()]


def error_group_name(*, last_error: str) -> tuple[str, str]:
    """The exception class and normalised message a failed row's error is grouped by, by the
    database's own functions (the ones its trigger keys the row with)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT jobs_error_class(%s), jobs_error_message(%s)", [last_error, last_error]
        )
        exception, message = cursor.fetchone()
    return exception, message


def error_group_url(key: str) -> str:
    """The admin's list of one group's jobs: what a group's count and a job's page link to."""
    changelist = reverse("admin:jobs_job_changelist")
    return f"{changelist}?{urlencode({'status__exact': Job.Status.FAILED, 'error_group': key})}"


def jobs_in_error_group(key: str) -> QuerySet[Job]:
    """The failed jobs of one group (what its link lists and its "Retry all" retries)."""
    return Job.objects.filter(status=Job.Status.FAILED, error_group=key)


@dataclass(frozen=True)
class GroupActed:
    """What a group's action did: how many jobs it changed, and the group's oldest job then
    (the admin's log entry is written against it: a log entry names one object)."""

    count: int
    first: Job | None


def error_group_retry(*, key: str) -> GroupActed:
    """Queue every failed job of one group to run now (`operator_actions.jobs_retry_now`: one
    UPDATE)."""
    return _act(key, "retried", jobs_retry_now)


def error_group_cancel(*, key: str) -> GroupActed:
    """Cancel every failed job of one group (`operator_actions.jobs_cancel`: one UPDATE, the rules
    of a single job's Cancel; `failed_at` and the error stay as history). A job of the group
    retried meanwhile is queued, no longer in the group, and is left alone."""
    return _act(key, "cancelled", jobs_cancel)


def _act(key: str, verb: str, service) -> GroupActed:
    jobs = jobs_in_error_group(key)
    first = jobs.order_by("pk").only("pk", "kind").first()
    count = service(jobs=jobs)
    logger.info(
        "error group %s %s: %s job(s)",
        key,
        verb,
        count,
        extra={"action": f"error_group_{verb}", "error_group": key, "count": count},
    )
    return GroupActed(count, first if count else None)
