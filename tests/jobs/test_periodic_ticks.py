"""Issue 38, point 4: the ticks of a `jobs.periodic` schedule, as pure functions (no sleep),
and the declarations refused at import (point 9, hostile input)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.exceptions import InvalidSchedule
from jobs.periodic_ticks import (
    Periodic,
    count_between,
    forget,
    latest_tick,
    next_tick,
    periodic,
    ticks_between,
)

BERLIN = ZoneInfo("Europe/Berlin")


def _cron(line: str, tz: str = "Europe/Berlin") -> Periodic:
    return Periodic(name="t", kind="tests.noop", cron=line, tz=tz)


def _berlin(*args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=BERLIN, fold=fold).astimezone(UTC)


def test_weekdays_at_nine_in_berlin():
    schedule = _cron("0 9 * * 1-5")
    friday_noon = _berlin(2026, 3, 27, 12, 0)
    assert next_tick(schedule, friday_noon) == _berlin(2026, 3, 30, 9, 0)  # Monday, CEST now
    assert latest_tick(schedule, friday_noon) == _berlin(2026, 3, 27, 9, 0)
    assert latest_tick(schedule, _berlin(2026, 3, 27, 9, 0)) == _berlin(2026, 3, 27, 9, 0)
    assert next_tick(schedule, _berlin(2026, 3, 27, 9, 0)) == _berlin(2026, 3, 30, 9, 0)


def test_a_wall_time_the_spring_forward_skips_does_not_fire():
    """2026-03-29 Berlin: 02:00 CET becomes 03:00 CEST; 02:30 does not exist that day."""
    schedule = _cron("30 2 * * *")
    ticks = list(ticks_between(schedule, _berlin(2026, 3, 27, 12, 0), _berlin(2026, 3, 30, 12, 0)))
    assert ticks == [_berlin(2026, 3, 28, 2, 30), _berlin(2026, 3, 30, 2, 30)]
    every_quarter = list(
        ticks_between(
            _cron("*/15 * * * *"), _berlin(2026, 3, 29, 1, 50), _berlin(2026, 3, 29, 3, 20)
        )
    )
    assert [t.astimezone(BERLIN).strftime("%H:%M") for t in every_quarter] == ["03:00", "03:15"]
    assert every_quarter == [_berlin(2026, 3, 29, 3, 0), _berlin(2026, 3, 29, 3, 15)]


def test_a_wall_time_the_fall_back_repeats_fires_once():
    """2026-10-25 Berlin: 03:00 CEST becomes 02:00 CET; 02:30 happens twice, fires once."""
    schedule = _cron("30 2 * * *")
    ticks = list(
        ticks_between(schedule, _berlin(2026, 10, 24, 12, 0), _berlin(2026, 10, 26, 12, 0))
    )
    assert ticks == [_berlin(2026, 10, 25, 2, 30), _berlin(2026, 10, 26, 2, 30)]
    assert ticks[0] == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # the first 02:30 (CEST)
    hourly = list(
        ticks_between(
            _cron("0 * * * *"), _berlin(2026, 10, 25, 0, 30), _berlin(2026, 10, 25, 4, 30)
        )
    )
    # 01:00 CEST, 02:00 CEST (not again at 02:00 CET), 03:00 CET, 04:00 CET: strictly increasing.
    assert hourly == [
        datetime(2026, 10, 24, 23, 0, tzinfo=UTC),
        datetime(2026, 10, 25, 0, 0, tzinfo=UTC),
        datetime(2026, 10, 25, 2, 0, tzinfo=UTC),
        datetime(2026, 10, 25, 3, 0, tzinfo=UTC),
    ]
    # Asked from inside the repeated hour (the second 02:40, CET), the latest tick is the one
    # 02:30 that fired, and the next is 03:00 CET: 02:30 does not fire a second time.
    second_pass = _berlin(2026, 10, 25, 2, 40, fold=1)
    assert latest_tick(schedule, second_pass) == ticks[0]
    assert next_tick(schedule, second_pass) == ticks[1]


def test_every_ticks_on_multiples_of_the_interval_since_the_epoch():
    schedule = Periodic(name="t", kind="tests.noop", every=7)
    at = datetime(2026, 5, 1, 12, 0, 3, 500_000, tzinfo=UTC)
    latest = latest_tick(schedule, at)
    assert latest <= at < latest + timedelta(seconds=7)
    assert latest.timestamp() % 7 == 0
    assert next_tick(schedule, latest) == latest + timedelta(seconds=7)
    assert next_tick(schedule, at) == latest + timedelta(seconds=7)
    assert count_between(schedule, latest, latest + timedelta(seconds=70)) == 9
    one_second = Periodic(name="t", kind="tests.noop", every=1)
    assert len(list(ticks_between(one_second, at, at + timedelta(seconds=10)))) == 10


LINES = st.sampled_from(
    [
        "0 9 * * 1-5",
        "30 2 * * *",
        "*/15 * * * *",
        "0 * * * *",
        "5 0 1 * *",
        "0 0 29 2 *",
        "45 23 * * 0",
        "0 1-3 * 3,10 *",
    ]
)
ZONES = st.sampled_from(["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "UTC"])
INSTANTS = st.datetimes(
    min_value=datetime(2024, 1, 1), max_value=datetime(2030, 12, 31), timezones=st.just(UTC)
)


@settings(max_examples=60, deadline=None)
@given(line=LINES, tz=ZONES, start=INSTANTS)
def test_consecutive_ticks_strictly_increase_and_match_the_line(line, tz, start):
    schedule = _cron(line, tz)
    zone = ZoneInfo(tz)
    previous = start
    for _ in range(6):
        tick = next_tick(schedule, previous)
        assert tick is not None and tick > previous
        wall = tick.astimezone(zone).replace(tzinfo=None)
        # The wall time is one the line names: cronsim's next match from a minute before it.
        assert next(CronSim(line, wall - timedelta(minutes=1))) == wall
        # ...and no tick was passed over: the latest tick just before this one is the previous.
        before = latest_tick(schedule, tick - timedelta(microseconds=1))
        assert before is None or before <= previous
        assert latest_tick(schedule, tick) == tick
        previous = tick


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"cron": "0 0 30 2 *"}, "bad cron line"),
        ({"cron": "0 0 31 4 *"}, "bad cron line"),
        ({"cron": "61 * * * *"}, "bad cron line"),
        ({"cron": "* * * *"}, "bad cron line"),
        ({"cron": "x" * 10_000}, "cron line of <="),
        ({"cron": ""}, "cron line of <="),
        ({"cron": 5}, "cron line of <="),
        ({"cron": "0 9 * * *", "tz": "Mars/Olympus"}, "unknown time zone"),
        ({"cron": "0 9 * * *", "tz": "../../etc/passwd"}, "unknown time zone"),
        ({"cron": "0 9 * * *", "every": 60}, "exactly one of"),
        ({}, "exactly one of"),
        ({"every": 0}, "below the minimum"),
        ({"every": -5}, "below the minimum"),
        ({"every": 0.5}, "below the minimum"),
        ({"every": float("nan")}, "number of seconds"),
        ({"every": float("inf")}, "number of seconds"),
        ({"every": "60"}, "number of seconds"),
        ({"every": True}, "number of seconds"),
        ({"every": 60, "tz": "Europe/Berlin"}, "tz= applies to cron= only"),
        ({"every": 60, "payload": [1]}, "payload must be a dict"),
        ({"every": 60, "payload": {"at": datetime(2026, 1, 1)}}, "payload is not JSON"),
        ({"every": 60, "payload": {"x": "\x00"}}, "without NUL"),
        ({"every": 60, "payload": {"x": "a" * 100_000}}, "bytes"),
    ],
)
def test_hostile_declarations_are_refused_with_a_clear_error(options, words):
    with pytest.raises(InvalidSchedule, match=words):
        periodic("tests.noop", name="tests.hostile", **options)
    forget("tests.hostile")


@pytest.mark.parametrize("kind", ["", None, "k" * 101, 7])
def test_a_bad_kind_is_refused(kind):
    with pytest.raises(InvalidSchedule, match="kind"):
        periodic(kind, every=60)


def test_a_second_declaration_under_one_name_must_be_the_same():
    try:
        first = periodic("tests.noop", name="tests.twice", every=60)
        assert periodic("tests.noop", name="tests.twice", every=60) == first  # re-import
        with pytest.raises(InvalidSchedule, match="already declared"):
            periodic("tests.noop", name="tests.twice", every=61)
    finally:
        forget("tests.twice")


def test_jobs_periodic_is_the_public_name():
    import jobs

    try:
        schedule = jobs.periodic(
            "tests.noop",
            name="tests.public",
            cron="0 9 * * 1-5",
            tz="Europe/Berlin",
            payload={"report": "daily"},
        )
        assert (schedule.cron, schedule.tz, schedule.payload) == (
            "0 9 * * 1-5",
            "Europe/Berlin",
            {"report": "daily"},
        )
    finally:
        forget("tests.public")


# --- issue 38, point 9: a property over random cron lines, against an oracle ----------------


def _field(low: int, high: int) -> st.SearchStrategy[str]:
    value = st.integers(low, high)
    return st.one_of(
        st.just("*"),
        value.map(str),
        st.integers(2, max(2, (high - low) // 2)).map(lambda k: f"*/{k}"),
        st.tuples(value, value).map(lambda p: f"{min(p)}-{max(p)}"),
        st.lists(value, min_size=2, max_size=3, unique=True).map(
            lambda vs: ",".join(map(str, sorted(vs)))
        ),
    )


RANDOM_LINES = st.tuples(
    _field(0, 59), _field(0, 23), _field(1, 31), _field(1, 12), _field(0, 6)
).map(" ".join)
DST_ZONES = st.sampled_from(
    ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Santiago", "UTC"]
)


@cache
def _transitions(tz: str) -> list[datetime]:
    """The instants of 2026 at which `tz`'s offset changes (found hour by hour)."""
    zone = ZoneInfo(tz)
    hours = [datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=h) for h in range(366 * 24)]
    return [
        later
        for earlier, later in zip(hours, hours[1:], strict=False)
        if earlier.astimezone(zone).utcoffset() != later.astimezone(zone).utcoffset()
    ]


def _near_a_change(tz: str) -> st.SearchStrategy[datetime]:
    """An instant up to 12 hours before one of `tz`'s daylight-saving changes (where the
    rules matter: a line firing hourly or more often meets it within its next 20 ticks), or
    any instant when it has none."""
    changes = _transitions(tz)
    if not changes:
        return INSTANTS
    return st.tuples(st.sampled_from(changes), st.integers(0, 12 * 60)).map(
        lambda pair: pair[0] - timedelta(minutes=pair[1])
    )


def _gap(wall: datetime, zone: ZoneInfo) -> bool:
    """PEP 495: a wall time a spring-forward skips reads the earlier offset with fold=0 and
    the later with fold=1, the later being larger; in a repeated hour the reverse."""
    first = wall.replace(tzinfo=zone, fold=0).utcoffset()
    second = wall.replace(tzinfo=zone, fold=1).utcoffset()
    return first < second


@settings(max_examples=60, deadline=None)
@given(
    line=RANDOM_LINES,
    tz_start=DST_ZONES.flatmap(lambda tz: st.tuples(st.just(tz), _near_a_change(tz))),
)
def test_ticks_are_the_lines_existing_wall_times_each_once_at_its_first_occurrence(line, tz_start):
    """Whatever the line and zone: each tick lies after the instant asked from, its wall
    time matches the line and exists (a spring-forward gap never fires), a repeated wall
    time fires at its first occurrence only, and the ticks are exactly the line's existing
    wall times in order: none skipped, none twice (the oracle walks cronsim's naive wall
    times and decides gaps and repeats from the zone's offsets, not from our code)."""
    tz, start = tz_start
    try:
        schedule = periodic("tests.noop", name="tests.random_line", cron=line, tz=tz)
    except InvalidSchedule:
        return  # a line that never fires (31 April) is refused, tested above
    finally:
        forget("tests.random_line")
    zone = ZoneInfo(tz)
    tick = next_tick(schedule, start)
    if tick is None:
        return
    assert tick > start
    ticks = [tick]
    for _ in range(20):
        following = next_tick(schedule, ticks[-1])
        if following is None:
            break
        ticks.append(following)
    walls = [t.astimezone(zone).replace(tzinfo=None) for t in ticks]
    for t, wall in zip(ticks, walls, strict=True):
        assert next(CronSim(line, wall - timedelta(minutes=1))) == wall  # matches the line
        assert not _gap(wall, zone)
        assert t == wall.replace(tzinfo=zone, fold=0).astimezone(UTC)  # first occurrence
    oracle = []
    for wall in CronSim(line, walls[0]):
        if len(oracle) == len(ticks) - 1:
            break
        if not _gap(wall, zone):
            oracle.append(wall.replace(tzinfo=zone, fold=0).astimezone(UTC))
    assert ticks[1:] == oracle
