"""ops.charts: counts become coordinates a reader can trust (tallest bar at the top line,
zero on the axis, stacked bars add up, every bucket present), in a wide and a narrow frame."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ops.charts import (
    NARROW,
    WIDE,
    SeriesIn,
    bucket_floor,
    buckets,
    nice_ceiling,
    stacked_bar_chart,
)

END = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def test_nice_ceiling_picks_a_readable_axis_top():
    assert [nice_ceiling(v) for v in (0, 1, 2, 3, 7, 11, 49, 51, 999)] == [
        1, 1, 2, 5, 10, 20, 50, 100, 1000,
    ]  # fmt: skip


def test_buckets_end_at_the_current_bucket():
    hours = buckets(end=END, step=timedelta(hours=1), count=24)
    assert len(hours) == 24 and hours[-1] == END and hours[0] == END - timedelta(hours=23)


def test_bucket_floor_counts_buckets_from_the_epoch_in_utc():
    at = datetime(2026, 12, 3, 13, 47, 12, tzinfo=UTC)
    assert bucket_floor(at, timedelta(minutes=30)) == datetime(2026, 12, 3, 13, 30, tzinfo=UTC)
    assert bucket_floor(at, timedelta(hours=3)) == datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    assert bucket_floor(at, timedelta(minutes=1)) == datetime(2026, 12, 3, 13, 47, tzinfo=UTC)


def test_stacked_bars_add_up_and_skip_empty_buckets():
    halves = buckets(end=END, step=timedelta(minutes=30), count=48)
    chart = stacked_bar_chart(
        title="mail",
        y_label="mails per 30 min",
        starts=halves,
        series=[
            SeriesIn("processed", "#0a0", {halves[0]: 6, halves[5]: 1}),
            SeriesIn("quarantined", "#a00", {halves[0]: 4}),
        ],
        tick_every=timedelta(hours=3),
        narrow_tick_every=timedelta(hours=6),
    )
    assert chart.bars == 48 and [s.total for s in chart.series] == [7, 4]
    for drawing, frame in ((chart.wide, WIDE), (chart.narrow, NARROW)):
        processed, quarantined = drawing.series
        assert len(processed.rects) == 2 and len(quarantined.rects) == 1
        first_processed, first_quarantined = processed.rects[0], quarantined.rects[0]
        assert first_processed.y + first_processed.height == frame.bottom
        # the quarantined bar sits on the processed one and the stack of 10 reaches the top
        assert first_quarantined.y + first_quarantined.height == first_processed.y
        assert first_quarantined.y == frame.top
        assert first_quarantined.title == f"{halves[0]:%H:%M} quarantined: 4"
        # each bar keeps to its slot: 48 slots across the plot, a gap between neighbours
        slot = (frame.right - frame.left) / 48
        assert first_processed.x >= frame.left and first_processed.width < slot
        assert [t.label for t in drawing.y_ticks] == ["0", "2", "4", "6", "8", "10"]
    wide_labels = [t.label for t in chart.wide.x_ticks]
    assert wide_labels == ["15:00", "18:00", "21:00", "00:00", "03:00", "06:00", "09:00", "12:00"]
    assert [t.label for t in chart.narrow.x_ticks] == ["18:00", "00:00", "06:00", "12:00"]
    assert chart.description == "mail (mails per 30 min): processed 7, quarantined 4"


def test_day_labels_sit_on_utc_midnight():
    threes = buckets(end=END, step=timedelta(hours=3), count=56)
    chart = stacked_bar_chart(
        title="jobs",
        y_label="jobs per 3 h",
        starts=threes,
        series=[SeriesIn("completed", "#0a0", {})],
        tick_every=timedelta(days=1),
        tick_format="%a %d",
    )
    labels = [t.label for t in chart.wide.x_ticks]
    assert labels == ["Fri 27", "Sat 28", "Sun 29", "Mon 30", "Tue 01", "Wed 02", "Thu 03"]
    assert [t.label for t in chart.wide.y_ticks] == ["0", "1"]  # an empty chart: axis 0..1
