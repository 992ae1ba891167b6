"""Start, stop and forget the embedded server; who uses it (the users file, client sessions).

Concurrent starts and stops are serialised by an exclusive lock on `var/pg.lock`, and
CREATE DATABASE tolerates one made at the same moment by another server client.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
from pathlib import Path

from project.embedded_pg.binaries import (
    _system_binaries,
    binaries_in_use,
    copy_dir,
    prune_binaries,
)
from project.embedded_pg.layout import (
    DATABASE,
    MAX_SOCKET_PATH,
    PG_CTL_TIMEOUT,
    SOCKET_NAME,
    SUPERUSER,
    SYSTEM_DIR,
    EmbeddedPostgresError,
    _absolute,
    _clean_stale_pid,
    _is_postmaster,
    _locked,
    _package_install,
    _postmaster_pid,
    _run,
    _Server,
    _update_users,
    database_url,
    is_running,
    pgdata_dir,
)
from project.embedded_pg.prepare import _owner_file, _prepare, ensure_system_dir, remove_orphans


def start(pgdata: Path | None = None, database: str = DATABASE, user: int | None = None) -> str:
    """Initialise (first run only), start if needed, create `database`; return its URL.
    With `user`: that process is recorded as a user of the server (see `stop`)."""
    pgdata = _absolute(pgdata or pgdata_dir())
    if len(str(pgdata / SOCKET_NAME)) > MAX_SOCKET_PATH:
        raise EmbeddedPostgresError(
            f"{pgdata} is too long for a Unix socket path ({MAX_SOCKET_PATH} bytes): set "
            "WORKER_VAR_DIR to a shorter folder, or set DATABASE_URL to a PostgreSQL server"
        )
    install = _package_install()
    with _locked(pgdata), _binaries_held():
        server = _prepare(pgdata, install)
        pid = _postmaster_pid(server.data)
        if pid is None or not _is_postmaster(pid, server.data):
            _clean_stale_pid(server.data)
            socket_dir = shlex.quote(str(server.data))
            _run(
                server,
                ["pg_ctl", "-D", str(server.data), "-w", "-t", str(PG_CTL_TIMEOUT)]
                + ["-l", str(server.data / "log")]
                + ["-o", f"-c listen_addresses='' -k {socket_dir}", "start"],
                "starting the embedded PostgreSQL",
            )
        _create_database(pgdata, database)
        if user is not None:
            _update_users(pgdata, add=user)
    if os.geteuid() == 0:
        remove_orphans()
        prune_binaries(keep=copy_dir(install))
    return database_url(pgdata, database)


def _binaries_held() -> contextlib.AbstractContextManager[None]:
    """As root: no copy of the binaries is pruned while this start or stop chooses one and
    runs it (see binaries.py); as another user the wheel's own binaries run."""
    if os.geteuid() != 0:
        return contextlib.nullcontext()
    ensure_system_dir(SYSTEM_DIR)
    return binaries_in_use()


class InUse(EmbeddedPostgresError):
    """`stop` without `--force` while a worker (a run-worker, a client) uses the server."""


def users(pgdata: Path | None = None) -> list[int]:
    """The live processes registered as users of the server (run-worker, scripts/test)."""
    pgdata = _absolute(pgdata or pgdata_dir())
    if not pgdata.parent.is_dir():
        return []
    return _update_users(pgdata)


def clients(pgdata: Path | None = None) -> int:
    """Client sessions connected to the server now, other than this one (0 if it does not
    answer): a worker started with DATABASE_URL pointing here is not in the users file."""
    import psycopg

    pgdata = _absolute(pgdata or pgdata_dir())
    try:
        with psycopg.connect(
            host=str(pgdata), user=SUPERUSER, dbname="postgres", connect_timeout=3
        ) as conn:
            (count,) = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                "AND pid <> pg_backend_pid()"
            ).fetchone()
    except psycopg.Error:
        return 0
    return int(count)


def stop(pgdata: Path | None = None, user: int | None = None, force: bool = True) -> bool:
    """Fast shutdown (open sessions are rolled back); False when it was not running. With
    `user`: that process is done with the server, which stops only when no other live
    process that started it with `--user` still uses it. Without `force` (the command line
    without `--force`), a server some worker still uses is left running: InUse."""
    pgdata = _absolute(pgdata or pgdata_dir())
    if not pgdata.parent.is_dir():
        return False
    with _locked(pgdata), _binaries_held():
        if user is not None and _update_users(pgdata, remove=user):
            return False
        if not is_running(pgdata):
            return False
        if not force:
            live, connected = _update_users(pgdata), clients(pgdata)
            if live or connected:
                who = f"run-worker pid {', '.join(map(str, live))}" if live else ""
                sessions = f"{connected} client session{'s' * (connected != 1)}"
                raise InUse(
                    f"a worker uses the database ({who or sessions}"
                    f"{f', {sessions}' if who and connected else ''}): stop the worker "
                    "first (Ctrl-C in its terminal), or stop the database anyway with --force"
                )
        data = pgdata.resolve()
        owner = data.stat().st_uid if os.geteuid() == 0 else None
        group = data.stat().st_gid if owner is not None else None
        bin_dir = _server_bin(data, owner)
        _run(
            _Server(data=data, bin=bin_dir, uid=owner, gid=group),
            ["pg_ctl", "-D", str(data), "-w", "-t", str(PG_CTL_TIMEOUT), "-m", "fast", "stop"],
            "stopping the embedded PostgreSQL",
        )
    return True


def _server_bin(data: Path, owner: int | None) -> Path:
    """The binaries of the running postmaster (its command line names them), so stopping
    works whichever copy started it; else the wheel's."""
    pid = _postmaster_pid(data)
    try:
        first = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        if Path(first).is_absolute():
            return Path(first).parent
    except (OSError, IndexError, UnicodeDecodeError):
        pass
    install = _package_install()
    return _system_binaries(install) / "bin" if owner not in (None, 0) else install / "bin"


def forget(pgdata: Path | None = None) -> None:
    """Remove a stopped server's data for good: `var/pg` and, as root, the folder it links
    to (bench/outage.py's throwaway server; an operator deleting var/ needs nothing more)."""
    pgdata = _absolute(pgdata or pgdata_dir())
    if is_running(pgdata):
        raise EmbeddedPostgresError(f"{pgdata} is running: stop it first")
    if pgdata.is_symlink():
        target = pgdata.resolve()
        if target.parent == SYSTEM_DIR and target.name.startswith("data-"):
            shutil.rmtree(target, ignore_errors=True)
            _owner_file(target).unlink(missing_ok=True)
        pgdata.unlink()
    elif pgdata.exists():
        shutil.rmtree(pgdata)


def _create_database(pgdata: Path, database: str) -> None:
    import psycopg
    from psycopg import errors, sql

    try:
        with psycopg.connect(
            host=str(pgdata), user=SUPERUSER, dbname="postgres", autocommit=True, connect_timeout=10
        ) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database])
            if not found.fetchone():
                try:
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
                except (errors.DuplicateDatabase, errors.UniqueViolation):
                    pass  # another client created it between the look-up and the CREATE
    except psycopg.OperationalError as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise EmbeddedPostgresError(f"the server does not answer in {pgdata}: {reason}") from exc
