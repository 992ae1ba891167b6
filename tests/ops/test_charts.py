"""ops.charts: counts become coordinates a reader can trust (tallest bar at the top line,
zero on the axis, stacked bars add up, every bucket present)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ops.charts import (
    BOTTOM,
    HEIGHT,
    TOP,
    SeriesIn,
    buckets,
    line_chart,
    nice_ceiling,
    stacked_bar_chart,
)

END = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
AXIS = HEIGHT - BOTTOM


def test_nice_ceiling_picks_a_readable_axis_top():
    assert [nice_ceiling(v) for v in (0, 1, 2, 3, 7, 11, 49, 51, 999)] == [
        1, 1, 2, 5, 10, 20, 50, 100, 1000,
    ]  # fmt: skip


def test_buckets_end_at_the_current_bucket():
    hours = buckets(end=END, step=timedelta(hours=1), count=24)
    assert len(hours) == 24 and hours[-1] == END and hours[0] == END - timedelta(hours=23)


def test_line_chart_has_a_point_per_bucket_and_scales_to_the_axis_top():
    minutes = buckets(end=END, step=timedelta(minutes=1), count=1440)
    chart = line_chart(
        title="jobs",
        starts=minutes,
        series=[SeriesIn("completed", "#000", {minutes[10]: 5, minutes[-1]: 2})],
        tick_every=timedelta(hours=3),
    )
    [series] = chart.series
    points = [tuple(map(float, p.split(","))) for p in series.points.split()]
    assert len(points) == 1440 and series.total == 7
    assert points[10][1] == TOP  # 5 is the axis top (nice_ceiling(5) == 5)
    assert points[0][1] == AXIS  # zero sits on the axis
    assert points[-1][1] == AXIS - (AXIS - TOP) * 2 / 5
    assert [t.label for t in chart.y_ticks] == ["0", "1", "2", "3", "4", "5"]
    labels = ["15:00", "18:00", "21:00", "00:00", "03:00", "06:00", "09:00", "12:00"]
    assert [t.label for t in chart.x_ticks] == labels


def test_stacked_bars_add_up_and_skip_empty_buckets():
    hours = buckets(end=END, step=timedelta(hours=1), count=24)
    chart = stacked_bar_chart(
        title="mail",
        starts=hours,
        series=[
            SeriesIn("processed", "#0a0", {hours[0]: 6, hours[5]: 1}),
            SeriesIn("quarantined", "#a00", {hours[0]: 4}),
        ],
        tick_every=timedelta(hours=6),
    )
    processed, quarantined = chart.series
    assert len(processed.rects) == 2 and len(quarantined.rects) == 1
    first_processed, first_quarantined = processed.rects[0], quarantined.rects[0]
    assert first_processed.y + first_processed.height == AXIS
    # the quarantined bar sits on the processed one and the stack of 10 reaches the top
    assert first_quarantined.y + first_quarantined.height == first_processed.y
    assert first_quarantined.y == TOP
    assert first_quarantined.title == f"{hours[0]:%H:00} quarantined: 4"
