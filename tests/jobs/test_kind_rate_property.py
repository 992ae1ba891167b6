"""The rate's window (issue 38, points 3 and 9; Hypothesis): whatever the times the claims
come at, the bucket's SQL (`jobs_rate_take_v1`, the one the claim runs) never gives more than
the rate's count plus one tokens in any window of the rate's unit ("20/s": at most 21 starts
in any one second), and a claim that comes when the bucket says the next token is due gets
it. And a rate's spelling parses back to itself.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.kind_rates import MAX_PER_SECOND, UNITS, Rate, parse_rate

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@given(
    count=st.integers(min_value=1, max_value=100_000),
    unit=st.sampled_from(sorted(UNITS)),
    spaces=st.booleans(),
)
def test_a_rate_parses_back_from_its_spelling_or_is_refused(count, unit, spaces):
    text = f" {count} / {unit} " if spaces else f"{count}/{unit}"
    per_seconds = UNITS[unit]
    if count / per_seconds > MAX_PER_SECOND:
        with pytest.raises(ValueError, match="at most"):
            parse_rate(text, kind="tests.k")
        return
    rate = parse_rate(text, kind="tests.k")
    assert rate == Rate(count=count, per_seconds=per_seconds)
    assert parse_rate(str(rate), kind="tests.k") == rate


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    count=st.integers(min_value=1, max_value=50),
    per_seconds=st.sampled_from([1, 60, 3600]),
    # Claims arrive after gaps measured in token intervals: bunched (0), late, early, idle.
    gaps=st.lists(
        st.one_of(
            st.just(0.0),
            st.floats(min_value=0.0, max_value=3.0, allow_nan=False),
            st.floats(min_value=0.95, max_value=1.05, allow_nan=False),
        ),
        min_size=1,
        max_size=60,
    ),
)
def test_no_window_of_the_rates_unit_gets_more_than_its_count_plus_one(count, per_seconds, gaps):
    interval = per_seconds / count
    at = T0
    next_slot = None
    takes: list[datetime] = []
    with connection.cursor() as cursor:
        for gap in gaps:
            at += timedelta(seconds=gap * interval)
            cursor.execute("SELECT jobs_rate_take_v1(%s, %s, %s)", [next_slot, at, interval])
            (after,) = cursor.fetchone()
            due = next_slot is None or next_slot <= at
            assert (after is not None) == due  # a token exactly when the bucket says one is due
            if after is not None:
                assert after > at  # the next one is ahead of the claim that took this one
                takes.append(at)
                next_slot = after
    window = timedelta(seconds=per_seconds)
    for n, start in enumerate(takes):
        within = sum(1 for t in takes[n:] if t <= start + window)  # a closed window
        assert within <= count + 1, (start, within, count, per_seconds)
