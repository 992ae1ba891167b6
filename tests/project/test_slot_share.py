"""The slots' share of a worker's pool (project/db_pool.py `SlotShare`): who gets a unit."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from psycopg_pool import PoolTimeout

from project.db_pool import OTHER_THREADS, SlotShare


def _slot_connection() -> SimpleNamespace:
    """What `bind` wraps on a slot thread: the two methods of Django's connection wrapper
    that open and close its server connection (here a connection that is never opened)."""
    return SimpleNamespace(get_new_connection=lambda params: object(), _close=lambda: None)


def test_a_slot_waiting_for_a_unit_gets_the_next_one_given_back():
    """A slot that gives its unit back and at once asks for one again (between two jobs,
    `tests/jobs/test_slot_pool.py`'s slots) must not take it ahead of a slot that waits.
    threading.Semaphore let it: the waiter was woken, but the unit was gone before it ran,
    and a slot of fifty could wait past DB_POOL_TIMEOUT while the units turned over every
    few hundred milliseconds, its attempt failed (CI, 2026-12-08: two jobs with two
    attempts). A unit given back goes to the slot that has waited longest."""
    share = SlotShare(max_size=OTHER_THREADS + 1, timeout=1.0)  # one unit for the slots
    holder, waiter = _slot_connection(), _slot_connection()
    share.bind(holder)
    share.bind(waiter)
    holder.get_new_connection({})
    served = threading.Event()

    def wait_for_a_unit() -> None:
        try:
            waiter.get_new_connection({})
        except PoolTimeout:
            return
        served.set()

    thread = threading.Thread(target=wait_for_a_unit)
    thread.start()
    deadline = time.monotonic() + 5
    while not share.wanted():
        assert time.monotonic() < deadline, "the second slot never waited"
        time.sleep(0.001)
    for _ in range(200):  # the holder's jobs, one after another
        holder._close()
        try:
            holder.get_new_connection({})
        except PoolTimeout:
            break  # the waiter has the unit and keeps it
    thread.join(5)
    assert served.is_set(), "the waiting slot never got a unit"
