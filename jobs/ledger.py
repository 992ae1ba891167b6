"""What a drain holds (issue 37): its claimed jobs not started yet, the ones running in
slots, the completions not sent yet, and how many slots each kind of slot has free. Shared
by the drain thread and its keeper under one lock.

A slot is busy from its job's start until that job's outcome is settled: at once for a
completion that may wait (a kind declared idempotent) or one already committed, but only
after the commit for a completion that must be flushed (I21): so a slot never starts its
next job while a completion it made could still be lost, and `kill -9` re-runs at most one
job per slot.

Reserved slots (issue 37, point 3, `@handler(kind, reserved=N)`): each kind of slot's
capacity is its kinds' reservations plus the shared rest. A job takes a slot of its own
kind's while one is free, else a shared one; `room()` says what each kind may start, and
the claim (migration 0024) takes no more than that, so a backfill never fills the slots a
reserved kind keeps.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from jobs import registry
from jobs.conf import get_config
from jobs.runner_step import ClaimedJob

THREAD, ASYNC = "thread", "async"

Done = tuple[ClaimedJob, float]  # a job run, and its handler's monotonic start


def must_flush(done: list[Done]) -> bool:
    """Whether these completions must be committed with the WAL flush before the slots they
    hold start again: unless every kind is declared idempotent (and
    JOBS_BATCH_IDEMPOTENT_COMPLETIONS is on), a completion lost in a crash would run its
    job again."""
    if not done:
        return False
    if not get_config().batch_idempotent_completions:
        return True
    return any(not registry.is_idempotent(job.kind) for job, _started in done)


def pool_of(job: ClaimedJob) -> str:
    return pool_of_kind(job.kind)


def pool_of_kind(kind: str) -> str:
    return ASYNC if registry.is_async(kind) else THREAD


@dataclass(frozen=True)
class Room:
    """What a claim may take, once the completions waiting are sent: each reserved kind's
    free own slots, and each kind of slot's free shared ones (jobs_runner_step_v6)."""

    reserved: dict[str, int]  # kind -> its free own slots
    async_kinds: list[str]  # the kinds the event loop runs (the rest: thread slots)
    thread_free: int  # free shared thread slots
    async_free: int  # free shared async slots


class Ledger:
    def __init__(
        self, *, threads: int, async_tasks: int, reserved: dict[str, int] | None = None
    ) -> None:
        self.lock = threading.Lock()
        self.reserved = dict(reserved or {})  # kind -> slots only it may use
        self.own_busy = dict.fromkeys(self.reserved, 0)
        self.places: dict[int, str | None] = {}  # job id -> its own kind's slot, or None: shared
        self.kind_of: dict[int, str] = {}  # job id -> kind, of every busy slot
        self.kind_busy: dict[str, int] = {}  # kind -> its busy slots
        shared = {THREAD: threads, ASYNC: async_tasks}
        for kind, count in self.reserved.items():
            shared[ASYNC if registry.is_async(kind) else THREAD] -= count
        self.shared_capacity = shared
        self.handing_back = threading.Lock()  # held by the keeper while its statements run
        self.capacity = {THREAD: threads, ASYNC: async_tasks}
        self.busy = {THREAD: 0, ASYNC: 0}
        self.unstarted: deque[ClaimedJob] = deque()
        self.running: dict[int, Done] = {}
        self.marked: set[int] = set()  # running jobs the keeper has marked started
        self.last_start = time.monotonic()  # of a job, or of the last claim
        self.done: list[Done] = []
        self.holding: dict[int, str] = {}  # job id -> pool, of completions held until flushed
        self.released = 0  # given back unstarted (by the keeper or at the end)
        self.settled: list[tuple[ClaimedJob, bool]] = []  # completions the keeper sent
        self.unsure: set[int] = set()  # completions sent in a statement whose answer was lost
        self.flush_pending = False  # a completion in `done` must be flushed before a start

    def add(self, jobs: list[ClaimedJob]) -> None:
        with self.lock:
            self.unstarted.extend(jobs)
            self.last_start = time.monotonic()

    def free(self, pool: str, *, after_send: bool = False) -> int:
        """Free slots of `pool`; `after_send`: once the completions held are sent."""
        with self.lock:
            held = sum(1 for p in self.holding.values() if p == pool) if after_send else 0
            return self.capacity[pool] - self.busy[pool] + held

    def start_next(self, pools: tuple[str, ...] = (THREAD, ASYNC)) -> Done | None:
        """Take the first unstarted job a free slot can run (claim order), counting its
        slot busy; None when none can start now."""
        with self.lock:
            for job in self.unstarted:
                pool = pool_of(job)
                if pool not in pools or self.busy[pool] >= self.capacity[pool]:
                    continue
                own = job.kind if self.own_busy.get(job.kind, 0) < self.reserved.get(
                    job.kind, 0
                ) else None  # fmt: skip
                if own is None and self._shared_busy(pool) >= self.shared_capacity[pool]:
                    continue  # its kind's own slots (if any) are busy, and the shared ones
                self.unstarted.remove(job)
                self.busy[pool] += 1
                self.places[job.id] = own
                self.kind_of[job.id] = job.kind
                self.kind_busy[job.kind] = self.kind_busy.get(job.kind, 0) + 1
                if own is not None:
                    self.own_busy[own] += 1
                now = time.monotonic()
                self.running[job.id] = (job, now)
                self.last_start = now
                return job, now
            return None

    def finished(self, job: ClaimedJob, *, done: bool) -> None:
        """`job` left its slot; `done`: its completion goes with a later statement. The slot
        stays busy while that completion must still be flushed."""
        with self.lock:
            entry = self.running.pop(job.id)
            self.marked.discard(job.id)
            pool = pool_of(job)
            if done:
                self.done.append(entry)
                if must_flush([entry]):
                    self.flush_pending = True
                    self.holding[job.id] = pool
                    return
            self._free_slot(job.id, pool)

    def sent(self, done: list[Done]) -> None:
        """These completions' statement has returned (committed, or its outcome unknown and
        left to the reaper): the slots they held are free."""
        with self.lock:
            for job, _started in done:
                pool = self.holding.pop(job.id, None)
                if pool is not None:
                    self._free_slot(job.id, pool)

    def _free_slot(self, job_id: int, pool: str) -> None:
        """`lock` held: the slot `job_id` held is free."""
        self.busy[pool] -= 1
        kind = self.kind_of.pop(job_id, None)
        if kind is not None:
            left = self.kind_busy[kind] - 1
            if left:
                self.kind_busy[kind] = left
            else:
                del self.kind_busy[kind]
        own = self.places.pop(job_id, None)
        if own is not None:
            self.own_busy[own] -= 1

    def _shared_busy(self, pool: str) -> int:
        """`lock` held: the shared slots of `pool` in use."""
        own = sum(n for kind, n in self.own_busy.items() if pool_of_kind(kind) == pool)
        return self.busy[pool] - own

    def in_use(self) -> dict[str, int]:
        """Busy slots per kind (running, or holding a completion until it is flushed)."""
        with self.lock:
            return dict(self.kind_busy)

    def room(self) -> Room:
        """What the next claim may take once the completions waiting are sent (they free
        their slots at that statement's commit)."""
        with self.lock:
            held_own: dict[str, int] = {}
            held_shared = {THREAD: 0, ASYNC: 0}
            for job_id, pool in self.holding.items():
                own = self.places.get(job_id)
                if own is None:
                    held_shared[pool] += 1
                else:
                    held_own[own] = held_own.get(own, 0) + 1
            reserved = {
                kind: count - self.own_busy[kind] + held_own.get(kind, 0)
                for kind, count in self.reserved.items()
            }
            free = {
                pool: self.shared_capacity[pool] - self._shared_busy(pool) + held_shared[pool]
                for pool in (THREAD, ASYNC)
            }
        return Room(
            reserved=reserved,
            async_kinds=registry.async_kinds(),
            thread_free=free[THREAD],
            async_free=free[ASYNC],
        )

    def must_send(self) -> bool:
        """Whether a completion waiting here must be committed before its slot starts again
        (a kind not declared idempotent, I21). Kept as a flag: asking the registry for each
        waiting job before every start cost a quarter of the loop's CPU."""
        with self.lock:
            return self.flush_pending

    def take_done_locked(self) -> list[Done]:
        """`take_done` for a caller that holds `lock`."""
        done, self.done = self.done, []
        self.flush_pending = False
        return done

    def put_back_done_locked(self, done: list[Done]) -> None:
        """Completions whose statement failed go out with the next one (`lock` held)."""
        self.done.extend(done)
        self.flush_pending = must_flush(self.done)

    def take_done(self) -> list[Done]:
        with self.lock:
            return self.take_done_locked()

    def has_unstarted(self) -> bool:
        with self.lock:
            return bool(self.unstarted)

    def has_running(self) -> bool:
        with self.lock:
            return bool(self.running)

    def held_ids(self) -> list[int]:
        """The rows this drain knows it holds: the keeper renews these leases only. A row
        claimed by a statement whose answer was lost, or given back by one, is not here:
        its lease runs out and the reaper decides (issue 29, point 2)."""
        with self.lock:
            ids = [job.id for job in self.unstarted]
            ids.extend(job.id for job, _started in self.done)
            ids.extend(self.running)
            return ids

    def take_unstarted(self) -> list[ClaimedJob]:
        with self.lock:
            unstarted = list(self.unstarted)
            self.unstarted.clear()
            return unstarted
