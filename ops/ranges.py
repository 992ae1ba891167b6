"""The health page's time ranges (issue 20): 1 h, 24 h, 7 d, each with a bucket size that
gives a readable number of bars (60, 48, 56) rather than 1,440 one-minute hairlines.

`?range=` comes from the address bar: anything but a known key falls back to the default,
and the page says so (the admin's own changelists treat a bad filter the same way: they show
the list, not an error page).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from ops.durations import humanize_seconds


@dataclass(frozen=True)
class ChartRange:
    key: str  # the ?range= value
    label: str  # "24 h"
    window: timedelta
    step: timedelta  # one bar
    tick_every: timedelta  # x labels, wide drawing
    narrow_tick_every: timedelta  # x labels, narrow drawing (a phone)
    tick_format: str
    bucket_format: str  # a bar's tooltip

    @property
    def bars(self) -> int:
        return self.window // self.step

    @property
    def per(self) -> str:
        """ "per minute", "per 30 min", "per 3 h": the unit of the y axis."""
        return "per minute" if self.step == timedelta(minutes=1) else f"per {self._step}"

    @property
    def _step(self) -> str:
        return humanize_seconds(self.step)


RANGES: dict[str, ChartRange] = {
    r.key: r
    for r in (
        ChartRange(
            "1h",
            "1 h",
            timedelta(hours=1),
            timedelta(minutes=1),
            timedelta(minutes=10),
            timedelta(minutes=15),
            "%H:%M",
            "%H:%M",
        ),
        ChartRange(
            "24h",
            "24 h",
            timedelta(hours=24),
            timedelta(minutes=30),
            timedelta(hours=3),
            timedelta(hours=6),
            "%H:%M",
            "%H:%M",
        ),
        ChartRange(
            "7d",
            "7 d",
            timedelta(days=7),
            timedelta(hours=3),
            timedelta(days=1),
            timedelta(days=2),
            "%a %d",
            "%a %d %H:%M",
        ),
    )
}
DEFAULT_RANGE = "24h"


def parse_range(value: str | None) -> tuple[ChartRange, str]:
    """The range `?range=` names, and a note for the page when the value was not one
    (empty: none given, or a known one)."""
    if not value or value in RANGES:
        return RANGES[value or DEFAULT_RANGE], ""
    shown = value if len(value) <= 20 else value[:20] + "…"
    default = RANGES[DEFAULT_RANGE]
    return default, f"Unknown range {shown!r}: showing the last {default.label}."
