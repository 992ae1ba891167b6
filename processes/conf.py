"""The settings the processes app reads, in one place (validated, each error naming the
variable)."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

# A process that has not beaten for this many of its own intervals is shown as gone.
MISSED_BEATS = 3
# Gone processes stay listed (health page, worker_status) this long after their last beat
# (seconds), and their rows are deleted after RETENTION_SECONDS.
GONE_LISTED_SECONDS = 3600
RETENTION_SECONDS = 7 * 24 * 3600
# A change of the current job or mail is written at most this often (seconds); the beat
# writes it anyway every interval.
CURRENT_WRITE_MIN_SECONDS = 1.0


@dataclass(frozen=True)
class Config:
    heartbeat_seconds: float  # PROCESS_HEARTBEAT_SECONDS: how often a process beats


def get_config() -> Config:
    value = getattr(settings, "PROCESS_HEARTBEAT_SECONDS", 10.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
        raise ImproperlyConfigured(
            f"PROCESS_HEARTBEAT_SECONDS={value!r} must be a number of seconds in (0, 3600]"
        )
    return Config(heartbeat_seconds=float(value))
