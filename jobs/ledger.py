"""What a drain holds (issue 37): its claimed jobs not started yet, the ones running in
slots, the completions not sent yet, and how many slots each kind of slot has free. Shared
by the drain thread and its keeper under one lock.

A slot is busy from its job's start until that job's outcome is settled: at once for a
completion that may wait (a kind declared idempotent) or one already committed, but only
after the commit for a completion that must be flushed (I21): so a slot never starts its
next job while a completion it made could still be lost, and `kill -9` re-runs at most one
job per slot.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from jobs import registry, services
from jobs.conf import get_config

THREAD, ASYNC = "thread", "async"

Done = tuple[services.ClaimedJob, float]  # a job run, and its handler's monotonic start


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


def pool_of(job: services.ClaimedJob) -> str:
    return ASYNC if registry.is_async(job.kind) else THREAD


class Ledger:
    def __init__(self, *, threads: int, async_tasks: int) -> None:
        self.lock = threading.Lock()
        self.handing_back = threading.Lock()  # held by the keeper while its statements run
        self.capacity = {THREAD: threads, ASYNC: async_tasks}
        self.busy = {THREAD: 0, ASYNC: 0}
        self.unstarted: deque[services.ClaimedJob] = deque()
        self.running: dict[int, Done] = {}
        self.marked: set[int] = set()  # running jobs the keeper has marked started
        self.last_start = time.monotonic()  # of a job, or of the last claim
        self.done: list[Done] = []
        self.holding: dict[int, str] = {}  # job id -> pool, of completions held until flushed
        self.released = 0  # given back unstarted (by the keeper or at the end)
        self.settled: list[tuple[services.ClaimedJob, bool]] = []  # completions the keeper sent
        self.unsure: set[int] = set()  # completions sent in a statement whose answer was lost
        self.flush_pending = False  # a completion in `done` must be flushed before a start

    def add(self, jobs: list[services.ClaimedJob]) -> None:
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
                if pool in pools and self.busy[pool] < self.capacity[pool]:
                    self.unstarted.remove(job)
                    self.busy[pool] += 1
                    now = time.monotonic()
                    self.running[job.id] = (job, now)
                    self.last_start = now
                    return job, now
            return None

    def finished(self, job: services.ClaimedJob, *, done: bool) -> None:
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
            self.busy[pool] -= 1

    def sent(self, done: list[Done]) -> None:
        """These completions' statement has returned (committed, or its outcome unknown and
        left to the reaper): the slots they held are free."""
        with self.lock:
            for job, _started in done:
                pool = self.holding.pop(job.id, None)
                if pool is not None:
                    self.busy[pool] -= 1

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

    def waiting_pool(self) -> str | None:
        """The kind of slot the first unstarted claim waits for (every one is busy), if any."""
        with self.lock:
            return pool_of(self.unstarted[0]) if self.unstarted else None

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

    def take_unstarted(self) -> list[services.ClaimedJob]:
        with self.lock:
            unstarted = list(self.unstarted)
            self.unstarted.clear()
            return unstarted
