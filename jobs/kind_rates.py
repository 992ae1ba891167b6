"""A rate per job kind for the whole deployment (issue 38, point 3): `@handler(kind,
rate="20/s")`, also per minute ("90/m", "90/min") and per hour ("3/h").

The rate is parsed and checked when the handler is registered (`parse_rate`: a bad one is an
ImproperlyConfigured naming the kind, at import of the handlers module, so at a worker's
start). The claim, which runs in PostgreSQL for every process and host at once, reads
`jobs_kindrate`: each worker (`qcluster`, `run_jobs`) writes its registry's rates there at
start-up, `kind_rates_sync()`, as it writes the caps (jobs/kind_caps.py): one statement that
inserts the new rates, corrects the changed ones and removes the rows of kinds its code has
no rate for, and logs what changed. A changed rate keeps its bucket's next token time.

The pace itself is the send-rate bucket's (notifications/pacing.py): one row per limited
kind whose `next_slot_at` moves to `greatest(next_slot_at, now) + 1/rate` when a token is
taken, by the claim that takes the job (migration 0025, `jobs_rate_take_v1`).

Two releases at once (a rolling deploy, I23): the previous release calls the same claim
functions, which honour the rates from the migration on once a worker of this release has
written them; a worker of the previous release leaves the table alone.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from django.db import connection

from jobs.kind_settings_report import log_sync, start_line

logger = logging.getLogger(__name__)

# The units a rate may be given in, and their seconds.
UNITS: dict[str, int] = {
    "s": 1,
    "sec": 1,
    "second": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "h": 3600,
    "hour": 3600,
}
_CANONICAL = {1: "s", 60: "m", 3600: "h"}
# The claim takes at most one token of a kind per statement (a tighter bound on the window
# than a burst would keep: docs/jobs.md), so a kind's jobs start at most as often as claims
# run; a rate above this would be a ceiling nobody reaches, not a pace.
MAX_PER_SECOND = 1000
_RATE = re.compile(r"\s*(\d+)\s*/\s*([a-z]+)\s*")


@dataclass(frozen=True)
class Rate:
    """`count` jobs per `per_seconds` seconds."""

    count: int
    per_seconds: int

    @property
    def interval_seconds(self) -> float:
        """Seconds between two tokens: the bucket's step."""
        return self.per_seconds / self.count

    def __str__(self) -> str:
        return f"{self.count}/{_CANONICAL[self.per_seconds]}"


def parse_rate(text: object, *, kind: str) -> Rate:
    """The rate `text` says ("20/s", "90/min", "3/h"), or ValueError naming `kind`."""
    where = f"job kind {kind!r}: rate={text!r}"
    if not isinstance(text, str):
        raise ValueError(f"{where} must be a string such as '20/s', '90/m' or '3/h'")
    match = _RATE.fullmatch(text.lower())
    if match is None or match.group(2) not in UNITS:
        raise ValueError(
            f"{where} is not a rate: a whole number of jobs per s, m (min) or h, "
            "such as '20/s', '90/m' or '3/h'"
        )
    count, per_seconds = int(match.group(1)), UNITS[match.group(2)]
    if count < 1:
        raise ValueError(f"{where} must allow at least one job (leave rate out for no limit)")
    if count / per_seconds > MAX_PER_SECOND:
        raise ValueError(f"{where} is over the most a rate may be: at most {MAX_PER_SECOND}/s")
    return Rate(count=count, per_seconds=per_seconds)


@dataclass(frozen=True)
class RateChange:
    kind: str
    was: str | None  # None: the kind had no rate
    now: str | None  # None: the rate was removed

    def __str__(self) -> str:
        if self.was is None:
            return f"{self.kind} {self.now} (new)"
        if self.now is None:
            return f"{self.kind} removed (was {self.was})"
        return f"{self.kind} {self.now} (was {self.was})"


# One statement, as the caps' sync (jobs/kind_caps.py): it commits whole or not at all, and
# concurrent starts cannot interleave half-syncs. `before` is the table as it was.
_SYNC_SQL = """
WITH wanted AS (
    SELECT w.kind, w.rate, w.interval_seconds
    FROM unnest(%s::text[], %s::text[], %s::float8[]) AS w(kind, rate, interval_seconds)
), before AS (
    SELECT r.kind, r.rate FROM jobs_kindrate AS r
), removed AS (
    DELETE FROM jobs_kindrate AS r WHERE r.kind NOT IN (SELECT w.kind FROM wanted AS w)
    RETURNING r.kind
), written AS (
    INSERT INTO jobs_kindrate AS r (kind, rate, interval_seconds, updated_at)
    SELECT w.kind, w.rate, w.interval_seconds, now() FROM wanted AS w
    ON CONFLICT (kind) DO UPDATE SET rate = excluded.rate,
        interval_seconds = excluded.interval_seconds, updated_at = now()
    WHERE r.rate <> excluded.rate OR r.interval_seconds <> excluded.interval_seconds
    RETURNING r.kind, r.rate
)
SELECT w.kind, b.rate, w.rate FROM written AS w LEFT JOIN before AS b USING (kind)
UNION ALL
SELECT r.kind, b.rate, NULL FROM removed AS r LEFT JOIN before AS b USING (kind)
ORDER BY 1
"""


def kind_rates_sync() -> list[RateChange]:
    """Make `jobs_kindrate` what this process's handlers say; return (and log) what changed.

    Called outside any transaction at a worker's start (a database error stops the start,
    as the caps' sync beside it does), and safe to repeat: a second call changes nothing.
    """
    from jobs import registry  # the registry imports this module's parser

    rates = registry.kind_rates()
    with connection.cursor() as cursor:  # one statement: one round trip, one commit
        cursor.execute(
            _SYNC_SQL,
            [
                list(rates),
                [str(rate) for rate in rates.values()],
                [rate.interval_seconds for rate in rates.values()],
            ],
        )
        changes = [RateChange(kind, was, now) for kind, was, now in cursor.fetchall()]
    log_sync(logger, "rates", rates, changes)
    return changes


def kind_rates_line(changes: list[RateChange]) -> str:
    """The start-up line of a worker command (beside the caps')."""
    from jobs import registry

    return start_line("rates", registry.kind_rates(), changes)
