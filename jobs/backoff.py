"""Retry delays: exponential in the attempt number, capped, plus jitter."""

from __future__ import annotations

import random

from jobs.conf import get_config

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
    if base is None or cap is None or jitter is None:
        config = get_config()
        base = config.backoff_base_seconds if base is None else base
        cap = config.backoff_cap_seconds if cap is None else cap
        jitter = config.backoff_jitter if jitter is None else jitter
    exponent = min(max(attempts, 1) - 1, _MAX_EXPONENT)
    delay = min(cap, base * 2**exponent)
    return delay + (rng or random).uniform(0, jitter * delay)
