"""ops.durations: waits and run times read as words, never as raw seconds (issue 20)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ops.durations import humanize_seconds


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0, "0 s"),
        (0.04, "0 s"),
        (3.4, "3.4 s"),
        (9.96, "10 s"),
        (59.6, "60 s"),
        (119, "119 s"),
        (125, "2 min"),
        (3599, "59 min"),
        (3600, "1 h"),
        (3723.4, "1 h 2 min"),
        (86400 + 4 * 3600 + 59, "1 d 4 h"),
        (2 * 86400, "2 d"),
        (-5, "0 s"),  # hosts' clocks apart: never a negative wait
        (timedelta(minutes=90), "1 h 30 min"),
        (None, "—"),
        (float("nan"), "—"),
    ],
)
def test_durations_read_as_words(seconds, words):
    assert humanize_seconds(seconds) == words
