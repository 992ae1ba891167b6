"""Django's connection pool (project/db_pool.py): on where DB_POOL=1 says so (the worker),
off unset or with DB_POOL=0, sized from the worker's threads, never with persistent
connections, a timeout that names the setting, and a forked child that never touches its
parent's pooled connections."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.processes import child_env, django_python

POOL = (
    "from django.conf import settings; import json;"
    "print(json.dumps(settings.DATABASES['default']['OPTIONS'].get('pool')))"
)


def _python(code: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return django_python(code, env=child_env(**env), timeout=timeout)


def _pool(**env: str) -> dict | None:
    result = _python(POOL, **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_pool_is_on_where_asked_sized_for_the_slots_and_the_other_threads():
    """Unset, off: a web process or a shell has no slot threads, and a pool keeps what it
    opened. The worker's start (scripts/run-worker, compose's worker) sets DB_POOL=1."""
    assert _pool(DB_POOL="") is None
    pool = _pool(DB_POOL="1", JOBS_CONCURRENCY="7")
    assert pool is not None
    assert pool["max_size"] == 7 + 4  # the slots, the drain, its keeper, two spare
    assert pool["min_size"] == 0
    assert pool["timeout"] == 30.0


def test_db_pool_0_turns_it_off_and_the_size_is_settable():
    assert _pool(DB_POOL="0") is None
    pool = _pool(DB_POOL="1", DB_POOL_MAX_SIZE="3", DB_POOL_TIMEOUT="2.5")
    assert (pool["max_size"], pool["timeout"]) == (3, 2.5)


def test_persistent_connections_mean_no_pool_unless_asked_for_then_start_up_stops():
    """Django refuses a pool with CONN_MAX_AGE > 0 only at the first query; here: at once."""
    assert _pool(DB_POOL="", DB_CONN_MAX_AGE="60") is None
    result = _python(POOL, DB_POOL="1", DB_CONN_MAX_AGE="60")
    assert result.returncode != 0
    assert "DB_POOL=1 and DB_CONN_MAX_AGE=60" in result.stderr.strip().splitlines()[-1]


@pytest.mark.django_db(transaction=True)
def test_a_thread_that_waits_too_long_for_a_connection_fails_naming_the_setting(subprocess_env):
    """One connection in the pool, held by the main thread: a second thread's query fails
    after DB_POOL_TIMEOUT with an error that says which setting to raise, never hangs."""
    code = """
import threading
from django.db import connection
connection.ensure_connection()  # holds the pool's only connection
errors = []
def query():
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:
        errors.append(exc)
thread = threading.Thread(target=query)
thread.start()
thread.join(30)
print(type(errors[0]).__name__, errors[0])
"""
    result = _python(
        code, **{**subprocess_env, "DB_POOL": "1", "DB_POOL_MAX_SIZE": "1", "DB_POOL_TIMEOUT": "1"}
    )
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith("OperationalError couldn't get a connection after 1.00 sec"), line
    assert "DB_POOL_MAX_SIZE=1" in line and "DB_POOL_TIMEOUT=1 s" in line, line


FORK = """
import json, multiprocessing
from django.db import connection, connections

def backend():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]

def child(queue):
    # As a django-q2 worker: queries, closes (back to its pool), and at its end closes
    # everything it knows of (Django's test teardown closes the pool too).
    seen = [backend()]
    connections.close_all()
    seen.append(backend())
    connections.close_all()
    connection.close_pool()
    queue.put(seen)

parent = backend()
connections.close_all()  # as django-q2's Sentinel before each fork: into the pool
context = multiprocessing.get_context("fork")
queue = context.Queue()
children = [context.Process(target=child, args=(queue,)) for _ in range(2)]
for process in children:
    process.start()
seen = [queue.get(timeout=60) for _ in children]
for process in children:
    process.join(60)
print(json.dumps([parent, backend(), seen, [process.exitcode for process in children]]))
"""


@pytest.mark.django_db(transaction=True)
def test_a_forked_child_uses_a_pool_of_its_own_and_leaves_its_parents_connections_alone(
    subprocess_env,
):
    """The parent used the pool and gave its connection back before forking (django-q2's
    Sentinel closes its connections before each spawn): each child connects on its own
    backend, never its parent's, and closing its pool leaves the parent's connection
    working (the parent's next query runs on the very same backend)."""
    result = _python(FORK, **{**subprocess_env, "DB_POOL": "1"})
    assert result.returncode == 0, result.stderr
    parent, parent_after, seen, exit_codes = json.loads(result.stdout.strip().splitlines()[-1])
    assert exit_codes == [0, 0]
    child_backends = {pid for pids in seen for pid in pids}
    assert parent not in child_backends, (parent, seen)
    assert parent_after == parent  # its pooled connection survived both children
    assert len({pids[0] for pids in seen}) == 2  # the children did not share one either


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("opener", ["processes.services.own_connection",
                                    "canonical_ids.leases.lease_connection"])  # fmt: skip
def test_the_beacons_and_the_leases_statement_connections_stay_out_of_the_pool(opener, monkeypatch):
    """The process beacon and the writer-slot lease open a connection per statement under an
    alias of their own; pooled, each alias would get a pool of its own, keeping a connection
    open per process for good (they beat more often than the pool's idle shrink). The
    default database's settings are given a pool here, as a worker's are (DB_POOL=1); the
    backends are watched from a plain connection, outside Django."""
    import importlib

    from django.db import connection

    from tests.support.processes import wait_until
    from tests.support.wakeup import raw_connection

    with raw_connection() as observer:
        pool = {"min_size": 0, "max_size": 2, "timeout": 5}
        monkeypatch.setitem(connection.settings_dict["OPTIONS"], "pool", pool)
        module, name = opener.rsplit(".", 1)
        with getattr(importlib.import_module(module), name)() as conn, conn.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (backend,) = cursor.fetchone()

        def gone() -> bool:
            row = observer.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [backend]
            ).fetchone()
            return row[0] == 0

        wait_until(gone, "its backend ended with the statement's connection", timeout=10)


@pytest.mark.django_db(transaction=True)
def test_the_wake_up_listener_keeps_a_dedicated_connection_outside_the_pool(monkeypatch):
    """Its LISTEN lives as long as the qcluster: from the pool, it would hold one of the
    process's connections for good (and a pooled session's LISTEN would outlive its use).
    The default database is given a pool here, as a worker's has (DB_POOL=1)."""
    from django.db import connection

    from jobs.wakeup import WakeListener

    pool = {"min_size": 0, "max_size": 2, "timeout": 5}
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "pool", pool)
    listener = WakeListener(workers=1)
    listener._connect()
    try:
        assert getattr(listener.connection, "_pool", None) is None
        assert listener.connection.info.parameter_status("application_name") == (
            "jobs-wake-listener"
        )
    finally:
        listener.connection.close()


WARMEST_FIRST = """
import json, threading
from django.db import connection

def backend():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]

first = backend()  # this thread's connection, checked out of the pool
others = []
taken, returned_first = threading.Event(), threading.Event()
def other():  # a slot thread: holds a second connection, gives it back after this one's
    others.append(backend())
    taken.set()
    returned_first.wait(30)
    connection.close()
thread = threading.Thread(target=other)
thread.start()
taken.wait(30)
connection.close()  # back to the pool first: the older of the two idle connections
returned_first.set()
thread.join()
after = backend()  # the next checkout of this thread
print(json.dumps([first, others[0], after]))
"""


@pytest.mark.django_db(transaction=True)
def test_the_pool_hands_out_the_connection_given_back_last(subprocess_env):
    """The most recently returned connection is taken first (as HikariCP does): its backend
    has just run the runner's statements, whose plans and catalog caches cost 20–50 ms to
    build on a fresh backend (a cold runner step, measured 24–46 ms against 1.5–2 ms warm).
    psycopg_pool hands out the oldest idle connection, so a drain's thread took a slot
    thread's connection, which had never run the claim, and its first step after an idle
    spell paid that again: issue 37 point 1's wake-up after an idle minute."""
    result = _python(WARMEST_FIRST, **{**subprocess_env, "DB_POOL": "1"})
    assert result.returncode == 0, result.stderr
    first, other, after = json.loads(result.stdout.strip().splitlines()[-1])
    assert other != first  # two connections in the pool
    assert after == other, (first, other, after)  # the last one given back, not the oldest
