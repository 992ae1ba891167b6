"""The id arithmetic (TsMinter) and the process minter's refusal to mint without a slot."""

from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canonical_ids import mint_ts
from canonical_ids.exceptions import NoWriterSlot
from canonical_ids.minter import MICROS, TsMinter, format_ts, parse_ts

T0 = 1_785_421_880.733


def test_two_minters_with_the_same_slot_mint_the_identical_id(clock):
    """V11 reproduction: the web and the worker both minting in slot 1 collide.

    The mechanism is real, so every process must hold a slot of its own.
    """
    clock.now = T0
    web = TsMinter(1, time_source=clock.time, sleep=clock.sleep)
    worker = TsMinter(1, time_source=clock.time, sleep=clock.sleep)
    assert web.mint() == worker.mint() == "1785421880.000001"


def test_four_distinct_slots_mint_no_collision(clock):
    """V11: the report's control: four slots x 200 ids in the same ticks never collide."""
    clock.now = T0
    minters = [TsMinter(slot, time_source=clock.time, sleep=clock.sleep) for slot in (1, 2, 3, 4)]
    ids = []
    for _ in range(200):
        for m in minters:
            ids.append(m.mint())
        clock.now += 0.0001
    assert len(ids) == len(set(ids)) == 800
    for m in minters:
        assert {parse_ts(t) % 100 for t in ids[m.slot - 1 :: 4]} == {m.slot}


def test_ids_have_the_slack_format_and_the_slot_residue(clock):
    clock.now = T0
    minter = TsMinter(42, time_source=clock.time, sleep=clock.sleep)
    ts = minter.mint()
    seconds, micros = ts.split(".")
    assert len(seconds) == 10 and len(micros) == 6
    assert int(micros) % 100 == 42
    assert format_ts(parse_ts(ts)) == ts


def test_clock_stepped_back_never_repeats(clock):
    """I2: a clock that steps back 30 s keeps counting from the last id."""
    clock.now = T0
    minter = TsMinter(7, time_source=clock.time, sleep=clock.sleep)
    before = [minter.mint() for _ in range(5)]
    clock.now -= 30
    after = [minter.mint() for _ in range(5)]
    sequence = before + after
    assert sequence == sorted(sequence) and len(set(sequence)) == 10
    assert after[0] == format_ts(parse_ts(before[-1]) + 100)
    assert clock.sleeps == []  # carrying on from the last id needs no wait


def test_clock_stepped_back_carries_into_the_next_tick_without_waiting(clock):
    """I2: a step back at the end of a tick carries into the next tick at once, no sleep."""
    clock.now = T0
    minter = TsMinter(7, time_source=clock.time, sleep=clock.sleep)
    for _ in range(9_999):
        minter.mint()
    last_of_tick = minter.mint()
    assert last_of_tick == "1785421880.999907"
    clock.now -= 5
    assert minter.mint() == "1785421881.000007"
    assert clock.sleeps == []


def test_exhausting_a_tick_waits_for_the_next(clock):
    """I2: 10,000 ids per second per slot: the 10,001st waits until the clock reaches the next
    tick."""
    clock.now = T0
    minter = TsMinter(4, time_source=clock.time, sleep=clock.sleep)
    tick = [minter.mint() for _ in range(10_000)]
    assert len(set(tick)) == 10_000
    assert {t.split(".")[0] for t in tick} == {"1785421880"}
    assert clock.sleeps == []
    nxt = minter.mint()
    assert nxt == "1785421881.000004"
    assert clock.sleeps and clock.now >= 1_785_421_881.0
    assert sum(clock.sleeps) == pytest.approx(1_785_421_881.0 - T0)


def test_a_new_floor_from_another_slot_starts_above_it(clock):
    clock.now = T0
    minter = TsMinter(12, floor=parse_ts("1785421999.000457"), time_source=clock.time)
    assert minter.mint() == "1785421999.000512"


@settings(max_examples=60, deadline=None)
@given(
    slot=st.integers(min_value=0, max_value=99),
    steps=st.lists(st.floats(min_value=-3.0, max_value=3.0), min_size=1, max_size=40),
    burst=st.integers(min_value=1, max_value=300),
)
def test_strictly_increasing_under_any_clock(slot, steps, burst):
    """I2: whatever the clock does (jumps, steps back, stalls), ids strictly increase in the
    class."""
    now = [T0]
    minter = TsMinter(
        slot,
        time_source=lambda: now[0],
        sleep=lambda s: now.__setitem__(0, now[0] + s),
    )
    values = []
    for step in steps:
        now[0] += step
        values.extend(minter.next_value() for _ in range(burst))
    assert all(a < b for a, b in itertools.pairwise(values))
    assert {v % 100 for v in values} == {slot}
    assert all(v % MICROS < MICROS for v in values)


def test_minting_with_role_none_raises(settings, process_minter):
    """I1: no slot, no id: never a silent fallback to the web's slot 1."""
    settings.CANONICAL_IDS_ROLE = "none"
    process_minter()
    with pytest.raises(NoWriterSlot, match="holds no writer slot"):
        mint_ts()


@pytest.mark.django_db(transaction=True)
def test_an_idle_holder_keeps_its_slot_live_on_a_timer(settings, process_minter):
    """Issue 20: the lease was renewed only when an id was minted, so a worker that had not
    minted for a lease's length showed its slot as free ("0 held") while it lived, and
    another process could claim it. A timer renews it while the holder lives."""
    from django.db import connection

    from canonical_ids.models import WriterSlotLease

    settings.CANONICAL_IDS_LEASE_TTL = 1.0
    settings.CANONICAL_IDS_RENEW_INTERVAL = 0.25
    minter = process_minter()
    slot = minter.acquire()
    time.sleep(2.5)  # two and a half lease lengths without a single mint

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT holder_token, expires_at > now() FROM canonical_ids_writerslotlease "
            "WHERE slot = %s",
            [slot],
        )
        token, live = cursor.fetchone()
    assert (token, live) == (minter.token, True)

    minter.release()  # a released slot is free at once, and the timer stops renewing it
    time.sleep(0.6)
    lease = WriterSlotLease.objects.get(slot=slot)
    assert lease.expires_at is None and lease.holder_token == ""
