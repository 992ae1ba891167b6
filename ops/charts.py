"""Time-series charts drawn on the server as SVG geometry (no JavaScript, nothing fetched).

Pure functions: series of counts per bucket in, coordinates and labels out. The template
`ops/_chart.html` turns them into an <svg>; Django's autoescaping covers every label.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

WIDTH, HEIGHT = 960, 220
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 14, 30  # margins around the plot area (px)


@dataclass(frozen=True)
class SeriesIn:
    """One named series: counts per bucket start (missing buckets are zero)."""

    name: str
    color: str
    counts: Mapping[datetime, int]


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    width: float
    height: float
    title: str


@dataclass(frozen=True)
class SeriesOut:
    name: str
    color: str
    total: int
    points: str = ""  # line charts: "x,y x,y …"
    rects: tuple[Rect, ...] = ()  # bar charts


@dataclass(frozen=True)
class Tick:
    pos: float
    label: str


@dataclass(frozen=True)
class Chart:
    title: str
    kind: str  # "line" | "bars"
    series: tuple[SeriesOut, ...]
    x_ticks: tuple[Tick, ...]
    y_ticks: tuple[Tick, ...]
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = WIDTH - RIGHT
    top: int = TOP
    bottom: int = HEIGHT - BOTTOM

    @property
    def description(self) -> str:
        totals = ", ".join(f"{s.name} {s.total}" for s in self.series)
        return f"{self.title}: {totals}"


def buckets(*, end: datetime, step: timedelta, count: int) -> list[datetime]:
    """`count` bucket starts, the last one the bucket that holds `end` (already aligned)."""
    return [end - step * (count - 1 - i) for i in range(count)]


def nice_ceiling(value: float) -> int:
    """The smallest 1, 2 or 5 × 10^n at or above `value` (at least 1): a readable axis top."""
    if value <= 1:
        return 1
    exponent = 10 ** math.floor(math.log10(value))
    for mantissa in (1, 2, 5, 10):
        if mantissa * exponent >= value:
            return int(mantissa * exponent)
    raise AssertionError("unreachable")  # pragma: no cover


def _y_ticks(top_value: int, y: Callable[[float], float]) -> tuple[Tick, ...]:
    """Gridlines at whole counts: 4 or 5 intervals of a 1-2-5 step (0..top in steps of 1
    when the top is small)."""
    exponent = 10 ** math.floor(math.log10(top_value))
    step = {1: exponent // 5, 2: exponent // 2, 5: exponent}.get(top_value // exponent, 0)
    step = max(step, 1) if top_value >= 5 else 1
    return tuple(Tick(pos=y(v), label=f"{v:,}") for v in range(0, top_value + 1, step))


def _x_ticks(
    starts: Sequence[datetime], x: Callable[[float], float], every: timedelta
) -> tuple[Tick, ...]:
    ticks = []
    for i, start in enumerate(starts):
        since_midnight = timedelta(hours=start.hour, minutes=start.minute)
        if since_midnight % every == timedelta(0):
            ticks.append(Tick(pos=x(i), label=f"{start:%H:%M}"))
    return tuple(ticks)


def line_chart(
    *, title: str, starts: Sequence[datetime], series: Sequence[SeriesIn], tick_every: timedelta
) -> Chart:
    """One polyline per series over the buckets (e.g. 1,440 minutes of a day)."""
    n = len(starts)
    values = [[s.counts.get(start, 0) for start in starts] for s in series]
    top_value = nice_ceiling(max((max(v, default=0) for v in values), default=0))
    span_x = (WIDTH - RIGHT - LEFT) / max(n - 1, 1)
    span_y = HEIGHT - BOTTOM - TOP

    def x(i: float) -> float:
        return round(LEFT + i * span_x, 2)

    def y(v: float) -> float:
        return round(HEIGHT - BOTTOM - span_y * v / top_value, 2)

    out = tuple(
        SeriesOut(
            name=s.name,
            color=s.color,
            total=sum(v),
            points=" ".join(f"{x(i)},{y(c)}" for i, c in enumerate(v)),
        )
        for s, v in zip(series, values, strict=True)
    )
    return Chart(
        title=title,
        kind="line",
        series=out,
        x_ticks=_x_ticks(starts, x, tick_every),
        y_ticks=_y_ticks(top_value, y),
    )


def stacked_bar_chart(
    *,
    title: str,
    starts: Sequence[datetime],
    series: Sequence[SeriesIn],
    tick_every: timedelta,
    bucket_label: str = "%H:00",
) -> Chart:
    """One bar per bucket, the series stacked in the order given (e.g. 24 hours of mail)."""
    n = len(starts)
    values = [[s.counts.get(start, 0) for start in starts] for s in series]
    stacks = [sum(v[i] for v in values) for i in range(n)]
    top_value = nice_ceiling(max(stacks, default=0))
    slot = (WIDTH - RIGHT - LEFT) / max(n, 1)
    span_y = HEIGHT - BOTTOM - TOP

    def x(i: float) -> float:
        return round(LEFT + i * slot, 2)

    def y(v: float) -> float:
        return round(HEIGHT - BOTTOM - span_y * v / top_value, 2)

    below = [0] * n
    out = []
    for s, v in zip(series, values, strict=True):
        rects = []
        for i, count in enumerate(v):
            if count:
                top = y(below[i] + count)
                rects.append(
                    Rect(
                        x=round(x(i) + slot * 0.1, 2),
                        y=top,
                        width=round(slot * 0.8, 2),
                        height=round(y(below[i]) - top, 2),
                        title=f"{starts[i]:{bucket_label}} {s.name}: {count}",
                    )
                )
                below[i] += count
        out.append(SeriesOut(name=s.name, color=s.color, total=sum(v), rects=tuple(rects)))
    return Chart(
        title=title,
        kind="bars",
        series=tuple(out),
        x_ticks=_x_ticks(starts, lambda i: x(i + 0.5), tick_every),
        y_ticks=_y_ticks(top_value, y),
    )
