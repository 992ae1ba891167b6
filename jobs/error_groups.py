"""Failed jobs grouped by kind, exception class and normalised message (issue 20).

The group is computed in SQL from `last_error`'s first line ("ExceptionClass: message", as
services.format_error writes it): numbers become N, long hex runs (ids, hashes) X, quoted
text '…', so "user 41 not found" and "user 97 not found" are one group. A group's key is
the md5 of kind, class and normalised message: the admin's list filter and "Retry all"
select by the same expression, so a group's link and its action cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.db.models import QuerySet
from django.db.models.expressions import RawSQL

from jobs.models import Job

TABLE = Job._meta.db_table
GROUPS_LISTED = 100
_FIRST = "split_part(last_error, E'\\n', 1)"
_CLASS = f"left(split_part({_FIRST}, ':', 1), 200)"
_MESSAGE = (
    "left(regexp_replace(regexp_replace(regexp_replace("
    f"btrim(substr({_FIRST}, length(split_part({_FIRST}, ':', 1)) + 2)), "
    "'[0-9a-fA-F]{8,}', 'X', 'g'), '[0-9]+', 'N', 'g'), "
    "'''[^'']*''|\"[^\"]*\"', '''…''', 'g'), 300)"
)
_KEY = f"md5(kind || E'\\x1f' || {_CLASS} || E'\\x1f' || {_MESSAGE})"


@dataclass(frozen=True)
class ErrorGroup:
    key: str
    kind: str
    exception: str
    message: str
    count: int
    first_seen: datetime | None
    last_seen: datetime | None


def job_error_groups(*, limit: int = GROUPS_LISTED) -> list[ErrorGroup]:
    """The groups of jobs failed for good, largest first; one GROUP BY over failed rows."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {_KEY}, kind, {_CLASS}, {_MESSAGE}, count(*), min(failed_at), max(failed_at) "
            f"FROM {TABLE} WHERE status = %s GROUP BY 1, 2, 3, 4 "
            "ORDER BY count(*) DESC, max(failed_at) DESC NULLS LAST LIMIT %s",
            [Job.Status.FAILED, limit],
        )
        return [ErrorGroup(*row) for row in cursor.fetchall()]


def jobs_in_error_group(key: str) -> QuerySet[Job]:
    """The failed jobs of one group (what its link lists and its "Retry all" retries)."""
    return Job.objects.filter(status=Job.Status.FAILED).filter(
        pk__in=RawSQL(
            f"SELECT id FROM {TABLE} WHERE status = %s AND {_KEY} = %s",
            [
                Job.Status.FAILED,
                key,
            ],
        )
    )
