"""Retry delays: exponential in the attempt number, capped, plus jitter.

One rule for every retry loop (jobs, mail, notifications, reconnects); each caller passes
its own base, cap and jitter from its app's settings. In project/ because the reconnect
loop (project/reconnect.py) uses it and must not import an app.
"""

from __future__ import annotations

import random

_MAX_EXPONENT = 60  # 2**60 seconds is far past any cap; keeps the float finite


def retry_delay(
    attempts: int,
    *,
    base: float,
    cap: float,
    jitter: float,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before the next try after `attempts` tries have failed.

    `min(cap, base * 2**(attempts-1))` plus a random extra of up to `jitter` times that, so
    jobs that failed together (a database blip, a crashed worker's batch) do not retry
    together. The cap bounds the exponential part; the jitter adds at most `jitter * cap`.
    """
    exponent = min(max(attempts, 1) - 1, _MAX_EXPONENT)
    delay = min(cap, base * 2**exponent)
    return delay + (rng or random).uniform(0, jitter * delay)
