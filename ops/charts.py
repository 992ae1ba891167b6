"""Time-series bar charts drawn on the server as SVG geometry (no JavaScript, nothing fetched).

Pure functions: counts per bucket in, coordinates and labels out. The template
`ops/_chart.html` turns them into <svg> elements; Django's autoescaping covers every label.

Each chart is drawn twice, for a wide and a narrow frame, and CSS shows the one that fits
(issue 20): an SVG scaled to a phone's width either squeezes its text (the old
`preserveAspectRatio="none"`) or shrinks it below reading size, so the narrow drawing has its
own geometry, fewer x labels, and text at its natural size. Both keep their aspect ratio.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Frame:
    """A drawing's size (SVG user units, drawn 1:1 in CSS px at its design width) and the
    margins around its plot area: room for the y labels and the rotated axis title on the
    left, the x labels and the axis title below."""

    width: int
    height: int
    left: int
    right_margin: int
    top: int
    bottom_margin: int

    @property
    def right(self) -> int:
        return self.width - self.right_margin

    @property
    def bottom(self) -> int:
        return self.height - self.bottom_margin


WIDE = Frame(width=960, height=240, left=64, right_margin=12, top=14, bottom_margin=42)
NARROW = Frame(width=360, height=220, left=56, right_margin=8, top=14, bottom_margin=42)


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
class Legend:
    name: str
    color: str
    total: int


@dataclass(frozen=True)
class Bars:
    name: str
    color: str
    rects: tuple[Rect, ...]


@dataclass(frozen=True)
class Tick:
    pos: float
    label: str


@dataclass(frozen=True)
class Drawing:
    """One chart's geometry in one frame."""

    frame: Frame
    series: tuple[Bars, ...]
    x_ticks: tuple[Tick, ...]
    y_ticks: tuple[Tick, ...]

    # The template reads these names.
    width = property(lambda self: self.frame.width)
    height = property(lambda self: self.frame.height)
    left = property(lambda self: self.frame.left)
    right = property(lambda self: self.frame.right)
    top = property(lambda self: self.frame.top)
    bottom = property(lambda self: self.frame.bottom)

    @property
    def y_label_y(self) -> float:
        """The rotated y-axis title is centred on the plot's height (rotate(-90) swaps x/y)."""
        return -(self.frame.top + self.frame.bottom) / 2

    @property
    def x_label_x(self) -> float:
        return (self.frame.left + self.frame.right) / 2


@dataclass(frozen=True)
class Chart:
    title: str
    y_label: str  # "jobs per 30 min": what one bar counts, with its unit
    x_label: str
    series: tuple[Legend, ...]
    wide: Drawing
    narrow: Drawing
    bars: int  # buckets drawn (each frame has a slot for every one)

    @property
    def drawings(self) -> tuple[dict[str, object], ...]:
        """For the template: each drawing with the CSS class that shows it at its widths."""
        return ({"name": "wide", "drawing": self.wide}, {"name": "narrow", "drawing": self.narrow})

    @property
    def description(self) -> str:
        totals = ", ".join(f"{s.name} {s.total}" for s in self.series)
        return f"{self.title} ({self.y_label}): {totals}"


def buckets(*, end: datetime, step: timedelta, count: int) -> list[datetime]:
    """`count` bucket starts, the last one the bucket that holds `end` (already aligned)."""
    return [end - step * (count - 1 - i) for i in range(count)]


def bucket_floor(moment: datetime, step: timedelta) -> datetime:
    """The start of the bucket of width `step` holding `moment`, buckets counted from the
    Unix epoch in UTC, as PostgreSQL's date_bin(step, t, epoch) counts them."""
    return moment - (moment - EPOCH) % step


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
    starts: Sequence[datetime], x: Callable[[float], float], every: timedelta, fmt: str
) -> tuple[Tick, ...]:
    """A label at each bucket start that is a whole multiple of `every` since the epoch
    (UTC): 00:00, 03:00, … or each midnight, whatever the window's first bucket."""
    return tuple(
        Tick(pos=x(i), label=f"{start:{fmt}}")
        for i, start in enumerate(starts)
        if (start - EPOCH) % every == timedelta(0)
    )


def _draw(
    frame: Frame,
    starts: Sequence[datetime],
    series: Sequence[SeriesIn],
    values: Sequence[Sequence[int]],
    top_value: int,
    tick_every: timedelta,
    tick_format: str,
    bucket_format: str,
) -> Drawing:
    n = len(starts)
    slot = (frame.right - frame.left) / max(n, 1)
    span_y = frame.bottom - frame.top

    def x(i: float) -> float:
        return round(frame.left + i * slot, 2)

    def y(v: float) -> float:
        return round(frame.bottom - span_y * v / top_value, 2)

    gap = min(slot * 0.2, 2.0)  # a hairline apart at most: bars, not a solid block
    below = [0] * n
    out = []
    for s, v in zip(series, values, strict=True):
        rects = []
        for i, count in enumerate(v):
            if count:
                top = y(below[i] + count)
                rects.append(
                    Rect(
                        x=round(x(i) + gap / 2, 2),
                        y=top,
                        width=round(slot - gap, 2),
                        height=round(y(below[i]) - top, 2),
                        title=f"{starts[i]:{bucket_format}} {s.name}: {count:,}",
                    )
                )
                below[i] += count
        out.append(Bars(name=s.name, color=s.color, rects=tuple(rects)))
    return Drawing(
        frame=frame,
        series=tuple(out),
        # A label sits under the start of its bucket: the left edge of that bucket's bar.
        x_ticks=_x_ticks(starts, x, tick_every, tick_format),
        y_ticks=_y_ticks(top_value, y),
    )


def stacked_bar_chart(
    *,
    title: str,
    y_label: str,
    starts: Sequence[datetime],
    series: Sequence[SeriesIn],
    tick_every: timedelta,
    narrow_tick_every: timedelta | None = None,
    tick_format: str = "%H:%M",
    bucket_format: str = "%H:%M",
    x_label: str = "time (UTC)",
) -> Chart:
    """One bar per bucket, the series stacked in the order given; both frames drawn."""
    values = [[s.counts.get(start, 0) for start in starts] for s in series]
    stacks = [sum(column) for column in zip(*values, strict=True)] if values else []
    top_value = nice_ceiling(max(stacks, default=0))
    common = (starts, series, values, top_value)
    return Chart(
        title=title,
        y_label=y_label,
        x_label=x_label,
        series=tuple(Legend(s.name, s.color, sum(v)) for s, v in zip(series, values, strict=True)),
        wide=_draw(WIDE, *common, tick_every, tick_format, bucket_format),
        narrow=_draw(NARROW, *common, narrow_tick_every or tick_every, tick_format, bucket_format),
        bars=len(starts),
    )
