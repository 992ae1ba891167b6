"""PostgreSQL's date_bin() for the ORM: time buckets of any width (1 min, 30 min, 3 h).

Django's Trunc functions stop at calendar units (minute, hour, day); the health page's
charts need 30-minute and 3-hour bars (issue 20). Buckets are counted from the Unix epoch
in UTC, whatever the session's time zone, the same way ops.charts.bucket_floor counts them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db.models import DateTimeField, DurationField, Func, Value

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class DateBin(Func):
    """date_bin(step, expression, epoch): the start of the bucket holding `expression`."""

    function = "date_bin"
    output_field = DateTimeField()

    def __init__(self, step: timedelta, expression: object) -> None:
        super().__init__(
            Value(step, output_field=DurationField()),
            expression,
            Value(EPOCH, output_field=DateTimeField()),
        )
