"""Template filters of the operator console: one way to show a duration (ops.durations)."""

from __future__ import annotations

from datetime import timedelta

from django import template

from ops.durations import humanize_seconds

register = template.Library()


@register.filter
def duration(seconds: float | timedelta | None) -> str:
    """`{{ attempt.duration_seconds|duration }}` -> "3.4 s", "1 h 2 min", "—"."""
    return humanize_seconds(seconds)
