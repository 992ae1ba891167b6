"""The unique index under random interleavings (issue 38, points 1 and 9; hypothesis,
bounded): three producer sessions of their own (plain SQL, as another producer would)
enqueue, complete, commit and roll back in a random order; a session whose statement waits
for another's transaction is left waiting until that one ends. Each transaction touches
one key, so no wait cycle (a deadlock) can form: one a producer builds itself, waiting on
two keys in opposite orders, is any unique index's, not this rule's.

Holds: no statement raises; at most one live job per key; every job id a committed
transaction was handed (inserted or existing) is in the table with its kind and key, and
every id a rolled-back transaction inserted is not.
"""

from __future__ import annotations

import queue
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.models import Job, JobUniqueKey
from tests.support.sessions import other_session

KEYS = ("a", "b")
ENQUEUE = (
    "SELECT job_id, inserted FROM jobs_enqueue_unique('tests.noop', '{}'::jsonb, %s, "
    "p_unique_for => %s::interval)"
)
COMPLETE = """
UPDATE jobs_job SET status = 'completed', completed_at = now(), locked_by = '',
    lease_expires_at = NULL
WHERE kind = 'tests.noop' AND unique_key = %s AND status IN ('queued', 'processing')
"""
STEP = st.tuples(
    st.integers(0, 2),  # session
    st.sampled_from(["enqueue", "enqueue_for", "complete", "commit", "rollback"]),
    st.sampled_from(KEYS),
)


class Producer(threading.Thread):
    """One session; runs its steps in order, each waiting as long as the database makes it."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.steps: queue.Queue = queue.Queue()
        self.idle = threading.Event()
        self.idle.set()
        self.errors: list[BaseException] = []
        self.key: str | None = None  # the one key of the open transaction
        self.handed: list[tuple[int, bool]] = []  # this transaction's answers
        self.committed: list[tuple[int, bool, str]] = []
        self.rolled_back_inserts: list[int] = []

    def run(self) -> None:
        with other_session() as session:
            while True:
                step = self.steps.get()
                if step is None:
                    session.rollback()
                    return
                try:
                    self._do(session, *step)
                except BaseException as exc:  # noqa: BLE001 - the property says none
                    self.errors.append(exc)
                    session.rollback()
                    self.key, self.handed = None, []
                finally:
                    self.idle.set()

    def _do(self, session, action: str, key: str) -> None:
        if action in ("commit", "rollback"):
            if action == "commit":
                session.commit()
                self.committed += [(job_id, inserted, self.key) for job_id, inserted in self.handed]
            else:
                session.rollback()
                self.rolled_back_inserts += [job_id for job_id, inserted in self.handed if inserted]
            self.key, self.handed = None, []
        elif action == "complete":
            session.execute(COMPLETE, [key])
        else:
            period = "10 minutes" if action == "enqueue_for" else None
            self.handed.append(session.execute(ENQUEUE, [key, period]).fetchone())

    def offer(self, action: str, key: str) -> bool:
        """Queue the step unless this session waits, or it would touch a second key."""
        if not self.idle.is_set():
            return False
        if action not in ("commit", "rollback"):
            if self.key not in (None, key):
                return False
            self.key = key
        self.idle.clear()
        self.steps.put((action, key))
        self.idle.wait(0.2)  # a step that waits longer is left waiting
        return True


@pytest.mark.django_db(transaction=True)
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(STEP, min_size=1, max_size=14))
def test_the_unique_rule_holds_under_random_interleavings(steps):
    Job.objects.all().delete()
    JobUniqueKey.objects.all().delete()
    producers = [Producer() for _ in range(3)]
    for producer in producers:
        producer.start()
    for session, action, key in steps:
        producers[session].offer(action, key)
    open_ = set(range(3))  # end every transaction; a waiting one once the others ended
    deadline = time.monotonic() + 15
    while open_ and time.monotonic() < deadline:
        open_ -= {n for n in open_ if producers[n].offer("commit", "")}
        time.sleep(0.01)
    assert not open_, "a session still waits after every other committed"
    for producer in producers:
        assert producer.idle.wait(15)
        producer.steps.put(None)
        producer.join(15)

    assert [p.errors for p in producers] == [[], [], []]
    rows = {job.pk: job for job in Job.objects.all()}
    for key in KEYS:
        live = [
            j for j in rows.values() if j.unique_key == key and j.status in ("queued", "processing")
        ]
        assert len(live) <= 1
    for producer in producers:
        for job_id, _inserted, key in producer.committed:
            assert job_id in rows, (job_id, steps)
            assert (rows[job_id].kind, rows[job_id].unique_key) == ("tests.noop", key)
        assert not set(producer.rolled_back_inserts) & set(rows)
