"""Retry delays: exponential in the attempt number, capped, plus jitter."""

from __future__ import annotations

import random

from django.conf import settings

_MAX_EXPONENT = 60  # 2**60 seconds is far past any cap; keeps the float finite


def retry_delay(
    attempts: int,
    *,
    base: float | None = None,
    cap: float | None = None,
    jitter: float | None = None,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before the next try after `attempts` tries have failed.

    `min(cap, base * 2**(attempts-1))` plus a random extra of up to `jitter` times that, so
    jobs that failed together (a database blip, a crashed worker's batch) do not retry
    together. The cap bounds the exponential part; the jitter adds at most `jitter * cap`.
    """
    base = settings.JOBS_BACKOFF_BASE_SECONDS if base is None else base
    cap = settings.JOBS_BACKOFF_CAP_SECONDS if cap is None else cap
    jitter = settings.JOBS_BACKOFF_JITTER if jitter is None else jitter
    exponent = min(max(attempts, 1) - 1, _MAX_EXPONENT)
    delay = min(cap, base * 2**exponent)
    return delay + (rng or random).uniform(0, jitter * delay)
