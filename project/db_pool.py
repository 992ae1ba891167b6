"""Django's connection pool (psycopg_pool) for processes whose threads need connections.

A worker process runs jobs in up to JOBS_CONCURRENCY thread slots beside its drain, keeper,
beacon and the canonical-id lease renewer; each thread used to open a Django connection of
its own (thread-local) and close it after a short idle. With `DATABASES["default"]
["OPTIONS"]["pool"]` (Django 5.1+) a thread checks a connection out of its process's pool at
its first query and gives it back at `connection.close()`: the process opens at most
DB_POOL_MAX_SIZE server connections, however many threads it runs, and reuses them instead
of connecting per thread.

What this module adds to Django's pool:

- `pool_options()`: the settings (DB_POOL, DB_POOL_MAX_SIZE, DB_POOL_MIN_SIZE,
  DB_POOL_TIMEOUT, DB_POOL_MAX_IDLE) and the refusal of a pool with persistent connections
  (DB_CONN_MAX_AGE > 0), which Django would only refuse at the first query.
- Fork safety (`forget_after_fork`): Django keeps the pools in a class-level dict
  (`DatabaseWrapper._connection_pools`), whose background threads do not survive a fork and
  whose idle connections are the parent's sockets. django-q2 forks its worker processes
  from a parent that used the pool (it even closes its connections just before: into the
  pool). A child that took one of them would talk on the parent's session; one that closed
  them would send Terminate and end the parent's. So the child starts with an empty dict
  (a pool of its own at its first query) and keeps the inherited pools referenced for its
  whole life: never closed, never freed (a freed psycopg connection sends nothing after a
  fork, but a closed one does; gc.freeze keeps them shared pages anyway).
- A timeout that names the settings (`_NamedTimeoutPool`): a thread that waited
  DB_POOL_TIMEOUT seconds for a connection fails saying which setting to raise, instead of
  psycopg_pool's bare "couldn't get a connection after 30.00 sec"; and a server that cannot
  be reached fails a query at once with libpq's own error, as without the pool, rather than
  after DB_POOL_TIMEOUT.
- The slots' share (`SlotShare`): thread slots hold at most DB_POOL_MAX_SIZE - 4 pooled
  connections at once, so the drain and its keeper never wait for a connection behind
  handlers. A busy slot keeps its connection from job to job (no checkout, and no health
  check round trip, per job) unless another slot waits for one: then it gives it back
  after its job; an idle slot gives it back after SLOT_IDLE_CLOSE_SECONDS, as before. (An
  `atomic=False` handler that queried once and then waits on a slow API holds its
  connection to the end of its job.) With the default size (JOBS_CONCURRENCY + 4) no slot
  ever waits for the share.
- A pool keeps the connection parameters it was created with: code that repoints
  `connection.settings_dict` at run time (the tests' PgBouncer and throwaway-cluster
  helpers) must `connection.close_pool()` before and after, or it keeps talking to the old
  server.
- At exit, the process closes the pools it created itself (not inherited ones), so the
  server sees a Terminate instead of a reset socket.
"""

from __future__ import annotations

import atexit
import copy
import os
import threading
from collections import deque
from time import monotonic
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from project.env import env_float, env_int, env_str

# Connections of a worker process's pool kept from its slots: the drain's and its keeper's
# (each held for the whole drain) and two for its other threads (the event loop's reads,
# an async handler's sync_to_async; in a qcluster's main process the wake sender, rollup and
# periodic scheduler). The process beacon and the writer-slot lease connect outside the
# pool, one connection per statement (`unpooled`), as before.
OTHER_THREADS = 4

# Seconds a client waits for the pool at a time before it looks again whether the pool's
# connecting fails (then it connects itself, failing fast as a direct connection would).
FAIL_FAST_SLICE = 0.2

_inherited: list[dict] = []  # pools a forked child inherited: kept, never closed
_armed = False


def pool_options(*, jobs_concurrency: int, conn_max_age: int) -> dict[str, Any] | None:
    """`OPTIONS["pool"]` for the default database, or None for no pool (DB_POOL=0).

    On where DB_POOL says so: the worker processes, whose job slots are threads that need
    connections (scripts/run-worker and compose's worker set DB_POOL=1). Unset, off: a web
    process or a shell has no such threads, and a pool keeps the connections it opened
    (psycopg_pool closes one idle connection per DB_POOL_MAX_IDLE), so every process of a
    deployment holding a pool by default filled a server's max_connections sooner (the test
    suite's, next to two chaos clusters). DB_POOL=1 with DB_CONN_MAX_AGE > 0 stops start-up,
    naming both (Django refuses both together)."""
    switch = env_str("DB_POOL", "").strip().lower()
    if switch in {"", "0", "false", "no", "off"}:
        return None
    if switch not in {"", "1", "true", "yes", "on"}:
        raise ImproperlyConfigured(
            f"Environment variable DB_POOL={switch!r} is not a valid boolean: use true/false, "
            "1/0, yes/no or on/off"
        )
    if conn_max_age > 0:
        if switch:  # set to on: both asked for
            raise ImproperlyConfigured(
                f"DB_POOL={switch} and DB_CONN_MAX_AGE={conn_max_age}: Django's connection "
                "pool does not support persistent connections. Unset DB_CONN_MAX_AGE (the "
                "pool keeps connections open itself) or set DB_POOL=0"
            )
        return None
    # Every slot and OTHER_THREADS at once: by default no thread of a worker process waits
    # for another's connection; lower it to bound the process's connections.
    max_size = env_int("DB_POOL_MAX_SIZE", jobs_concurrency + OTHER_THREADS, minimum=1)
    min_size = env_int("DB_POOL_MIN_SIZE", 0, minimum=0)
    if min_size > max_size:
        raise ImproperlyConfigured(
            f"DB_POOL_MIN_SIZE={min_size} must not exceed DB_POOL_MAX_SIZE={max_size}"
        )
    return {
        "min_size": min_size,
        "max_size": max_size,
        # Seconds a thread waits for a free connection before its query fails.
        "timeout": env_float("DB_POOL_TIMEOUT", 30.0, minimum=0.1),
        # Every this many seconds the pool closes one connection above min_size that stayed
        # unused throughout (psycopg_pool shrinks one at a time).
        "max_idle": env_float("DB_POOL_MAX_IDLE", 30.0, minimum=1.0),
        "name": "default",
    }


def unpooled(settings_dict: dict[str, Any]) -> dict[str, Any]:
    """A copy of a database's settings without the pool: for a connection opened for one
    statement under an alias of its own (the process beacon's, the writer-slot lease's),
    which Django would otherwise give a pool of its own, kept open for good."""
    settings_copy = copy.deepcopy(settings_dict)
    settings_copy.get("OPTIONS", {}).pop("pool", None)
    return settings_copy


def pooled(alias: str = "default") -> bool:
    """Whether `alias` goes through Django's pool in this process's settings."""
    from django.conf import settings

    return bool(settings.DATABASES[alias].get("OPTIONS", {}).get("pool"))


class _Waiter:
    __slots__ = ("granted", "woken")

    def __init__(self) -> None:
        self.granted = False
        self.woken = threading.Event()


class FairUnits:
    """A counting semaphore that serves its waiters in the order they came: a unit given back
    goes straight to the longest waiter. threading.Semaphore only wakes one, and a thread
    that gave a unit back and asks again at once (a slot between two jobs) took it before
    the woken one ran: with fifty slots on four units one slot waited past DB_POOL_TIMEOUT
    while the units turned over every few hundred milliseconds
    (tests/project/test_slot_share.py)."""

    def __init__(self, units: int) -> None:
        self._free = units
        self._waiters: deque[_Waiter] = deque()
        self._lock = threading.Lock()

    def acquire(self, timeout: float) -> bool:
        with self._lock:
            if self._free and not self._waiters:
                self._free -= 1
                return True
            waiter = _Waiter()
            self._waiters.append(waiter)
        waiter.woken.wait(timeout)
        with self._lock:
            if waiter.granted:  # perhaps just after the wait timed out: it is ours
                return True
            self._waiters.remove(waiter)
            return False

    def release(self) -> None:
        with self._lock:
            if self._waiters:
                waiter = self._waiters.popleft()
                waiter.granted = True
                waiter.woken.set()
            else:
                self._free += 1


class SlotShare:
    """The pooled connections a drain's thread slots may hold at once: the pool's size less
    the OTHER_THREADS the worker process keeps for its drain, keeper and other threads (at
    least one). `bind()` makes a slot thread take a unit when its Django
    connection checks one out of the pool and give it back when it returns it."""

    def __init__(self, max_size: int, timeout: float) -> None:
        self.units = max(1, max_size - OTHER_THREADS)
        self.max_size = max_size
        self.timeout = timeout
        self._free = FairUnits(self.units)  # first come, first served
        self._waiting = 0  # slots waiting for a unit now
        self._lock = threading.Lock()

    def wanted(self) -> bool:
        """Whether a slot waits for a unit now: then a slot that finished its job gives its
        connection back instead of keeping it for its next job."""
        return self._waiting > 0

    @classmethod
    def for_settings(cls, alias: str = "default") -> SlotShare | None:
        """The share for the pool of `alias`, or None without a pool."""
        from django.conf import settings

        options = settings.DATABASES[alias].get("OPTIONS", {}).get("pool")
        if not options:
            return None
        options = {} if options is True else options
        return cls(
            options.get("max_size") or options.get("min_size", 4), options.get("timeout", 30)
        )

    def bind(self, wrapper: Any) -> None:
        """On a slot thread, with its own Django connection wrapper (thread-local)."""
        get_new_connection, close = wrapper.get_new_connection, wrapper._close
        held = False

        def checked_out(conn_params: dict) -> Any:
            nonlocal held
            with self._lock:
                self._waiting += 1
            try:
                acquired = self._free.acquire(timeout=self.timeout)
            finally:
                with self._lock:
                    self._waiting -= 1
            if not acquired:
                from psycopg_pool import PoolTimeout

                raise PoolTimeout(
                    f"a job slot waited {self.timeout:g} s (DB_POOL_TIMEOUT) for a connection: "
                    f"the slots may hold {self.units} of the pool's {self.max_size} at once "
                    f"(DB_POOL_MAX_SIZE less {OTHER_THREADS} for the drain, its keeper and "
                    "the process's other threads); raise DB_POOL_MAX_SIZE"
                )
            held = True
            try:
                return get_new_connection(conn_params)
            except BaseException:
                held = False
                self._free.release()
                raise

        def given_back() -> Any:
            nonlocal held
            try:
                return close()
            finally:
                if held:
                    held = False
                    self._free.release()

        wrapper.get_new_connection = checked_out
        wrapper._close = given_back


def install() -> None:
    """Once per process (AppConfig.ready): the named-timeout pools, the fork hook and the
    exit hook. Harmless without a pool."""
    global _armed
    if _armed:
        return
    _armed = True
    from django.db.backends.postgresql.base import DatabaseWrapper

    DatabaseWrapper._connection_pools = _Pools(DatabaseWrapper._connection_pools)
    os.register_at_fork(after_in_child=forget_after_fork)
    atexit.register(_close_own_pools)


def forget_after_fork() -> None:
    """In a forked child: drop every inherited pool and connection without closing them
    (they are the parent's) so the first query opens a pool of the child's own."""
    from django.db import connections
    from django.db.backends.postgresql.base import DatabaseWrapper

    _inherited.append(DatabaseWrapper._connection_pools)
    DatabaseWrapper._connection_pools = _Pools()
    # The forking thread's own wrappers (the only thread left): a connection checked out
    # of the parent's pool, or a direct one, is the parent's socket; forget it unclosed.
    for wrapper in connections.all(initialized_only=True):
        if wrapper.connection is not None:
            _inherited.append({"connection": wrapper.connection})
            wrapper.connection = None
            wrapper.in_atomic_block = False
            wrapper.needs_rollback = False
            wrapper.savepoint_ids = []
            wrapper.atomic_blocks = []


def _close_own_pools() -> None:
    from django.db.backends.postgresql.base import DatabaseWrapper

    for pool in list(DatabaseWrapper._connection_pools.values()):
        if getattr(pool, "_owner_pid", None) == os.getpid():
            try:
                pool.close(timeout=1.0)
            except Exception:  # noqa: BLE001 - at exit: nothing left to tell
                pass


class _Pools(dict):
    """Django's `_connection_pools`: each pool Django creates gets the named timeout and
    remembers the process that created it (`setdefault` is how Django stores one)."""

    def setdefault(self, alias: str, pool: Any = None) -> Any:
        from psycopg_pool import ConnectionPool

        if type(pool) is ConnectionPool:
            pool.__class__ = _NamedTimeoutPool
            pool._owner_pid = os.getpid()
        return super().setdefault(alias, pool)


def _named_timeout_pool_class() -> type:
    from psycopg_pool import ConnectionPool, PoolTimeout

    class NamedTimeoutPool(ConnectionPool):
        """psycopg_pool's pool, failing as a direct connection would when the server cannot
        be reached, and whose timeout names the settings to change.

        psycopg_pool connects in its background workers and retries with a backoff for
        minutes while its clients wait out their whole timeout: with the server down (or a
        wrong port) every query waited DB_POOL_TIMEOUT and then failed with "couldn't get a
        connection", libpq's reason lost (the admin's "database is not reachable" page and
        every reconnect loop read it: project/quiet_log.py). So once the pool's last attempt
        to connect failed, a client with no idle connection to take connects itself, as
        without the pool: it fails at once with libpq's error, or its new connection joins
        the pool (within DB_POOL_MAX_SIZE). Uses psycopg_pool's internals (`_connect`,
        `_lock`, `_nconns`, `_pool`): pinned in pyproject.toml."""

        _owner_pid: int = 0
        _connect_error: BaseException | None = None

        def _connect(self, timeout: float | None = None) -> Any:
            try:
                conn = super()._connect(timeout)
            except Exception as exc:
                self._connect_error = exc
                raise
            self._connect_error = None
            return conn

        def getconn(self, timeout: float | None = None) -> Any:
            waited = self.timeout if timeout is None else timeout
            deadline = monotonic() + waited
            while True:
                if self._connect_error is not None:
                    conn = self._connect_as_client()
                    if conn is not None:
                        return conn
                try:
                    return super().getconn(min(FAIL_FAST_SLICE, max(0.0, deadline - monotonic())))
                except PoolTimeout:
                    if monotonic() < deadline:
                        continue
                    raise PoolTimeout(
                        f"couldn't get a connection after {waited:.2f} sec: all "
                        f"{self.max_size} connections of this process's pool "
                        f"(DB_POOL_MAX_SIZE={self.max_size}) stayed in use for "
                        f"DB_POOL_TIMEOUT={waited:g} s; raise DB_POOL_MAX_SIZE (at least "
                        f"JOBS_CONCURRENCY + {OTHER_THREADS} for a worker) or find the thread "
                        "that holds its connection"
                    ) from None

        def _get_ready_connection(self, timeout: float | None) -> Any:
            """The idle connection given back last, not psycopg_pool's oldest (called under
            the pool's lock). A backend that has just run the runner's statements has their
            plans and the catalogs they read cached; a fresh one takes 20–50 ms to build them
            on its first runner step (1.5–2 ms warm). Handed out oldest first, a drain's
            thread took a slot thread's connection, which had never claimed, and the first
            job after an idle spell waited for that (issue 37, point 1). The pool's shrink
            still closes the oldest idle one: the connections left are the warm ones."""
            if self._pool and (timeout is None or timeout > 0.0):  # else it takes none
                self._pool.rotate(1)  # the newest to the left end, where it is taken from
            return super()._get_ready_connection(timeout)

        def _check_connection(self, conn: Any) -> None:
            """A connection the server ended (a restart, `pg_terminate_backend`) fails its
            check: its idle siblings most likely died with it. psycopg_pool would take and
            check them one by one, sleeping 1 s, 2 s, 4 s... between two failed checks (up
            to DB_POOL_TIMEOUT after a restart); they are dropped at once instead, told by
            a zero-timeout poll of their sockets, with no round trip."""
            try:
                super()._check_connection(conn)
            except Exception:
                self._drop_ended_idle()
                raise

        def _drop_ended_idle(self) -> None:
            from project.reconnect import server_ended  # the settings import this module

            with self._lock:
                ended = [idle for idle in self._pool if server_ended(idle)]
                for idle in ended:
                    self._pool.remove(idle)
                    self._nconns -= 1
            for idle in ended:
                self._close_connection(idle)

        def _connect_as_client(self) -> Any:
            """After a failed connect, with nothing idle to take: connect on this thread
            (libpq's error raised as is), the connection counted in the pool's size."""
            with self._lock:
                if self._pool or self._nconns >= self.max_size:
                    return None  # an idle one to take, or no room: wait as usual
                self._nconns += 1
            try:
                conn = self._connect()
            except BaseException:
                with self._lock:
                    self._nconns -= 1
                raise
            conn._pool = self
            return conn

    return NamedTimeoutPool


try:
    _NamedTimeoutPool = _named_timeout_pool_class()
except ImportError:  # psycopg_pool absent: DB_POOL=0 is the only choice
    _NamedTimeoutPool = None  # type: ignore[assignment]
