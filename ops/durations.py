"""Durations in words a person reads at a glance ("3.4 s", "1 h 2 min", "2 d 3 h").

One helper for every place that shows a wait or a run time to a person (the health page,
worker_status's text output, its findings): issue 20 found waits printed as raw seconds
("waiting 3723.4s"). Machine output (`worker_status --json`, /metrics) keeps plain seconds.
"""

from __future__ import annotations

import math
from datetime import timedelta


def humanize_seconds(seconds: float | timedelta | None) -> str:
    """A tenth of a second below 10 s, whole seconds below 2 min, then whole minutes, then
    two units at most, the larger first ("1 h 2 min", "3 d 4 h"). None (no figure) is an em
    dash; a negative span (clocks apart) reads 0 s."""
    if seconds is None:
        return "—"
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    if not math.isfinite(seconds):
        return "—"
    seconds = max(seconds, 0.0)
    if seconds < 9.95:
        return f"{seconds:.1f} s".replace(".0 s", " s")
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"
