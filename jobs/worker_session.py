"""A qcluster worker process keeps its database session between django-q2 tasks (issue 37,
point 1: the wake-up p95 under 50 ms, "a burst after an idle minute included").

django-q2's worker calls Django's `close_old_connections()` before every task. With
`CONN_MAX_AGE=0` (our default, right for gunicorn's request cycle) that closed the worker's
session each time, so the drain of every wake task connected anew (3-5 ms) and the new server
process compiled the claim step's PL/pgSQL and planned its statements again: a first claim of
13-17 ms against 3-4 ms on a warm session. Seen in the server's log, that was about half of the
35-60 ms from a commit to its job's start after an idle spell.

In a worker process the default alias is made persistent (`CONN_MAX_AGE=None`). Django's health
check (`CONN_HEALTH_CHECKS`, on in project/settings.py) still tests the kept session with one
`SELECT 1` before the first query of each task, so a session the server or a pooler ended
(restart, failover, idle timeout) is replaced at that task, not used. Left alone:
- Django's pool (`DB_POOL=1`): it keeps its sessions itself and refuses persistent ones;
- `DB_CONN_MAX_AGE` > 0: the operator's age, after which Django renews the session;
- threads of the worker that close their connection when done (thread slots, the keeper);
- a task run synchronously in a web or test process (`sync=True`), which also sends
  `post_spawn`.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections


def keep_session_on_spawn(sender: Any = None, proc_name: str = "", **kwargs: Any) -> None:
    """django-q2's `post_spawn`, in each new worker process."""
    if multiprocessing.parent_process() is None:  # sync=True: not a qcluster worker
        return
    keep_worker_session()


def keep_worker_session() -> bool:
    """Make this process's default database session persistent; True if it was changed."""
    database = connections.settings[DEFAULT_DB_ALIAS]
    if "pool" in database.get("OPTIONS", {}) or database.get("CONN_MAX_AGE") != 0:
        return False
    # Every wrapper of this alias (one per thread) shares this dict: a connection opened
    # from now on is kept; `close_at` of one already open says when it was opened for.
    database["CONN_MAX_AGE"] = None
    for connection in connections.all(initialized_only=True):
        if connection.alias == DEFAULT_DB_ALIAS:
            connection.close_at = None
    return True
