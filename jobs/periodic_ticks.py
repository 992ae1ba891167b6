"""Jobs on a calendar (issue 38, point 4): the declaration and the tick arithmetic.

`jobs.periodic(kind, cron="0 9 * * 1-5", tz="Europe/Berlin", payload={...})` or
`jobs.periodic(kind, every=30)`, called at import of a handlers module, declares a schedule;
the qcluster's scheduler thread (jobs/periodic_scheduler.py) enqueues a real job per tick.
A schedule is code, never a row: a row could be edited into something no review saw.

Everything is checked at declaration, so a bad schedule stops the import (start-up), never a
tick: an unknown time zone, a cron line that never fires (30 February), an interval under one
second, both or neither of `cron` and `every`, a payload that is no JSON object.

Ticks are pure functions of the schedule and a time, testable without sleeping:

- `every=N` ticks at the multiples of N seconds since the Unix epoch (UTC), so every host
  computes the same instants whatever its start time.
- a cron line is matched against the local wall clock of `tz` (cronsim, the parser
  healthchecks.io keeps). Each wall time the line names is mapped to one instant: a wall
  time a daylight-saving change skips does not exist and does not fire; one it repeats fires
  once, at its first occurrence (fold=0). That is why the line is iterated on naive wall
  times and not on aware ones: each wall time comes out once, and the mapping decides.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from jobs.exceptions import InvalidSchedule

MIN_EVERY_SECONDS = 1.0
MAX_CRON_CHARS = 200
MAX_PAYLOAD_BYTES = 64 * 1024
# A cron line that has no tick within this many years never fires in practice (cronsim
# rejects 30 February itself; this catches what it lets through, e.g. 29 Feb on a Monday
# is fine, but a line whose only match is centuries away is a mistake).
HORIZON_YEARS = 30

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Periodic:
    """One declared schedule. `name` keys its ticks in the database (defaults to the kind)."""

    name: str
    kind: str
    cron: str | None = None
    tz: str = "UTC"
    every: float | None = None
    payload: dict[str, Any] = field(default_factory=dict, compare=True, hash=False)
    overlap: bool = False

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    def describe(self) -> str:
        if self.cron is not None:
            return f"cron {self.cron!r} in {self.tz}"
        return f"every {self.every:g} s"


_schedules: dict[str, Periodic] = {}
_lock = threading.Lock()


def periodic(
    kind: str,
    *,
    cron: str | None = None,
    tz: str | None = None,
    every: float | None = None,
    payload: dict[str, Any] | None = None,
    name: str | None = None,
    overlap: bool = False,
) -> Periodic:
    """Declare that a `kind` job is enqueued at each tick of `cron` (in `tz`) or `every` seconds.

    Declaring the same schedule twice (a module imported again) is allowed; a different
    schedule under a name already taken raises, since which one ran would depend on import
    order. `overlap=False` (the default) skips a tick while the previous tick's job is still
    queued or processing. Raises InvalidSchedule for anything that could never run as meant.
    """
    schedule = _validated(kind, cron=cron, tz=tz, every=every, payload=payload, name=name)
    schedule = Periodic(**{**schedule.__dict__, "overlap": bool(overlap)})
    with _lock:
        existing = _schedules.get(schedule.name)
        if existing is not None and existing != schedule:
            raise InvalidSchedule(
                f"periodic schedule {schedule.name!r} is already declared as {existing}; "
                f"refusing {schedule} (give one of them another name=)"
            )
        _schedules[schedule.name] = schedule
    return schedule


def declared() -> list[Periodic]:
    """Every schedule declared in this process, after the handler modules are imported."""
    from jobs.registry import discover

    discover()
    with _lock:
        return sorted(_schedules.values(), key=lambda s: s.name)


def forget(name: str) -> None:
    """Drop a declaration (tests declare schedules of their own)."""
    with _lock:
        _schedules.pop(name, None)


def _validated(kind: Any, *, cron: Any, tz: Any, every: Any, payload: Any, name: Any) -> Periodic:
    if not isinstance(kind, str) or not kind or len(kind) > 100:
        raise InvalidSchedule(f"periodic kind must be a non-empty string of <= 100 chars: {kind!r}")
    if name is None:
        name = kind
    if not isinstance(name, str) or not name or len(name) > 200:
        raise InvalidSchedule(f"periodic name must be a non-empty string of <= 200 chars: {name!r}")
    if (cron is None) == (every is None):
        raise InvalidSchedule(
            f"periodic {name!r}: give exactly one of cron= or every= (got cron={cron!r}, "
            f"every={every!r})"
        )
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise InvalidSchedule(
            f"periodic {name!r}: payload must be a dict, not {type(payload).__name__}"
        )
    try:
        encoded = json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidSchedule(f"periodic {name!r}: payload is not JSON: {exc}") from None
    if len(encoded.encode()) > MAX_PAYLOAD_BYTES or "\\u0000" in encoded:
        raise InvalidSchedule(
            f"periodic {name!r}: payload must be JSON of <= {MAX_PAYLOAD_BYTES} bytes without NUL"
        )
    if every is not None:
        if tz is not None:
            raise InvalidSchedule(f"periodic {name!r}: tz= applies to cron= only, not every=")
        if (
            isinstance(every, bool)
            or not isinstance(every, int | float)
            or not math.isfinite(every)
        ):
            raise InvalidSchedule(
                f"periodic {name!r}: every= must be a number of seconds: {every!r}"
            )
        if every < MIN_EVERY_SECONDS:
            raise InvalidSchedule(
                f"periodic {name!r}: every={every!r} s is below the minimum of "
                f"{MIN_EVERY_SECONDS:g} s"
            )
        return Periodic(name=name, kind=kind, every=float(every), payload=payload)
    if not isinstance(cron, str) or not cron.strip() or len(cron) > MAX_CRON_CHARS:
        raise InvalidSchedule(
            f"periodic {name!r}: cron= must be a cron line of <= {MAX_CRON_CHARS} chars"
        )
    tz = "UTC" if tz is None else tz
    if not isinstance(tz, str) or not tz or len(tz) > 100:
        raise InvalidSchedule(f"periodic {name!r}: tz= must be an IANA time zone name: {tz!r}")
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidSchedule(f"periodic {name!r}: unknown time zone {tz!r}") from None
    schedule = Periodic(name=name, kind=kind, cron=cron.strip(), tz=tz, payload=payload)
    try:
        CronSim(schedule.cron, datetime(2000, 1, 1))
    except CronSimError as exc:
        raise InvalidSchedule(f"periodic {name!r}: bad cron line {cron!r}: {exc}") from None
    start = datetime(2026, 1, 1, tzinfo=UTC)
    first = next_tick(schedule, start)
    if first is None or first - start > timedelta(days=366 * HORIZON_YEARS):
        raise InvalidSchedule(f"periodic {name!r}: cron line {cron!r} never fires")
    return schedule


# --- ticks: pure functions of a schedule and an instant ----------------------------------------


def _instant(wall: datetime, zone: ZoneInfo) -> datetime | None:
    """The one instant a cron wall time fires at, or None when the wall time does not exist
    (a spring-forward gap). A repeated wall time maps to its first occurrence (fold=0)."""
    aware = wall.replace(tzinfo=zone, fold=0)
    instant = aware.astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) != wall:
        return None  # the wall time fell in a gap: it round-trips to another wall time
    return instant


def _cron_walls(schedule: Periodic, start_wall: datetime, *, reverse: bool) -> Iterator[datetime]:
    try:
        yield from CronSim(schedule.cron, start_wall, reverse=reverse)
    except (StopIteration, CronSimError):  # cronsim's own horizon
        return


def next_tick(schedule: Periodic, after: datetime) -> datetime | None:
    """The first tick strictly after the aware instant `after` (UTC), or None if none."""
    if schedule.every is not None:
        seconds = (after - _EPOCH).total_seconds()
        n = math.floor(seconds / schedule.every) + 1
        return _EPOCH + timedelta(seconds=n * schedule.every)
    zone = schedule.zone
    # Start one minute back on the wall clock: a wall time just before `after` may map to
    # an instant after it across a fall-back (and vice versa); the filter below decides.
    start_wall = after.astimezone(zone).replace(tzinfo=None, fold=0) - timedelta(hours=3)
    for wall in _cron_walls(schedule, start_wall, reverse=False):
        instant = _instant(wall, zone)
        if instant is not None and instant > after:
            return instant
        if wall.year > after.year + HORIZON_YEARS + 1:
            return None
    return None


def latest_tick(schedule: Periodic, at: datetime) -> datetime | None:
    """The last tick at or before the aware instant `at`, or None if none."""
    if schedule.every is not None:
        seconds = (at - _EPOCH).total_seconds()
        n = math.floor(seconds / schedule.every)
        return _EPOCH + timedelta(seconds=n * schedule.every)
    zone = schedule.zone
    start_wall = at.astimezone(zone).replace(tzinfo=None, fold=0) + timedelta(hours=3)
    for wall in _cron_walls(schedule, start_wall, reverse=True):
        instant = _instant(wall, zone)
        if instant is not None and instant <= at:
            return instant
        if wall.year < at.year - HORIZON_YEARS - 1:
            return None
    return None


def ticks_between(schedule: Periodic, after: datetime, until: datetime) -> Iterator[datetime]:
    """The ticks strictly after `after` and at or before `until`, in order."""
    tick = next_tick(schedule, after)
    while tick is not None and tick <= until:
        yield tick
        tick = next_tick(schedule, tick)


def count_between(
    schedule: Periodic, after: datetime, before: datetime, *, cap: int = 100_000
) -> int:
    """How many ticks fall strictly between `after` and `before` (at most `cap` for cron)."""
    if schedule.every is not None:
        first = next_tick(schedule, after)
        if first is None or first >= before:
            return 0
        return math.ceil((before - first).total_seconds() / schedule.every - 1e-9)
    count = 0
    for tick in ticks_between(schedule, after, before):
        if tick >= before or count >= cap:
            break
        count += 1
    return count


def checked_schedules() -> list[Periodic]:
    """Every declared schedule, or InvalidSchedule naming the first whose kind no handler
    runs: a qcluster calls this at start-up (a typo in a kind would otherwise enqueue, at
    every tick, a job that fails as an unknown kind)."""
    from jobs.registry import registered_kinds

    kinds = set(registered_kinds())
    schedules = declared()
    for schedule in schedules:
        if schedule.kind not in kinds:
            raise InvalidSchedule(
                f"periodic {schedule.name!r}: no handler is registered for kind "
                f"{schedule.kind!r} (declare it with @jobs.handler in a handlers module, or "
                "name it in JOBS_EXTRA_HANDLER_MODULES)"
            )
    return schedules
