"""Template filters of the operator console: one way to show a duration (ops.durations) and
one way to show a moment (the admin's DATETIME_FORMAT, project/formats: ISO, UTC, seconds)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django import template
from django.utils import formats

from ops.durations import humanize_seconds

register = template.Library()


@register.filter
def duration(seconds: float | timedelta | None) -> str:
    """`{{ attempt.duration_seconds|duration }}` -> "3.4 s", "1 h 2 min", "—"."""
    return humanize_seconds(seconds)


@register.filter
def utc(value: datetime | str | None) -> str:
    """`{{ process.started_at|utc }}` -> "2026-12-04 16:46:05 UTC" for a datetime or the ISO
    string worker_status's report carries; "" for none (chain `|default:"—"`)."""
    if not value:
        return ""
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    if moment.tzinfo is None:
        raise ValueError(f"a naive time cannot be shown as UTC: {value!r}")
    return formats.date_format(moment.astimezone(UTC), "DATETIME_FORMAT")
