"""I5: retry delays grow exponentially, carry jitter, and respect the cap."""

from __future__ import annotations

import random

from project.backoff import retry_delay


def test_delays_double_per_attempt_until_the_cap_with_bounded_jitter():
    rng = random.Random(7)
    base, cap, jitter = 10.0, 300.0, 0.25
    for attempts in range(1, 12):
        expected = min(cap, base * 2 ** (attempts - 1))
        samples = [
            retry_delay(attempts, base=base, cap=cap, jitter=jitter, rng=rng) for _ in range(200)
        ]
        assert min(samples) >= expected
        assert max(samples) <= expected * (1 + jitter)
        assert len(set(samples)) > 150  # jittered, not one value
    # exponential below the cap: 10, 20, 40, 80, 160 then capped at 300
    floors = [min(cap, base * 2 ** (a - 1)) for a in range(1, 8)]
    assert floors == [10, 20, 40, 80, 160, 300, 300]


def test_huge_attempt_counts_stay_finite_and_capped():
    assert retry_delay(10_000, base=10, cap=3600, jitter=0) == 3600


def test_zero_jitter_is_deterministic():
    assert retry_delay(3, base=1.5, cap=100, jitter=0) == 6.0
