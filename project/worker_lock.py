"""One worker per var/, whatever was killed (issue 31, point 4; issue 36, point 3).

`scripts/run-worker` claims its var/ before anything else: a second run-worker on the same
var/ (the same mail folders, the same embedded database, the same demo marker) quietly
started a second full worker. Now it names the processes that hold the var/ and exits 1.

The claim is a `flock` on `var/worker.lock`, taken on a file descriptor the script opened
(`exec 9>>var/worker.lock`) and this module inherits. A flock belongs to the open file, not
to a process: the script's qcluster and every worker process it forks inherit the same
descriptor, and the kernel keeps the lock until the last of them has exited. So a `kill -9`
of the script alone (an OOM kill, a supervisor that kills only its child) no longer frees
the var/ while its qcluster runs on; the lock used to be the script's pid in a file, which a
second run-worker took for dead and claimed. Processes that are not part of the worker (the
embedded PostgreSQL server, which may outlive it) are started without the descriptor.

`var/worker.pid` still records the script's pid, for a system without /proc (macOS), where
the holders cannot be listed. Like embedded_pg, this module must not import Django: the
script runs it before any setting exists.

    python -m project.worker_lock claim PID FD   # exit 1, naming the holders, if one runs
    python -m project.worker_lock release PID    # only PID's record is removed
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

from project.embedded_pg import _pid_alive, var_dir

PID_FILE = "worker.pid"
LOCK_FILE = "worker.lock"
_PROC = Path("/proc")
_CLAIM_ATTEMPTS = 3  # a holder may exit between the failed flock and the look for it


class Refused(Exception):
    """Another worker holds the var/; the text names it and says what to do."""


def claim(pid: int, fd: int, folder: Path | None = None) -> None:
    """Take the var/'s lock on `fd` (an open descriptor of `folder/worker.lock` that the
    worker's processes inherit) and record `pid`; Refused if another worker holds it."""
    folder = folder or var_dir()
    lock_path = folder / LOCK_FILE
    try:
        opened, wanted = os.fstat(fd), lock_path.stat()
    except OSError as exc:
        raise ValueError(f"cannot check descriptor {fd} against {lock_path}: {exc}") from exc
    if (opened.st_dev, opened.st_ino) != (wanted.st_dev, wanted.st_ino):
        raise ValueError(f"descriptor {fd} is not open on {lock_path}")
    for _ in range(_CLAIM_ATTEMPTS):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holding = holders(lock_path)
            if holding or not _PROC.joinpath("self").exists():
                raise Refused(_refusal(folder, holding)) from None
            time.sleep(0.1)  # its last holder exited just now: try again
            continue
        (folder / PID_FILE).write_text(f"{pid}\n")
        return
    raise Refused(_refusal(folder, []))


def holders(lock_path: Path) -> list[int]:
    """The pids of the processes holding the flock on `lock_path`, from /proc: each process
    with a descriptor on the file whose fdinfo lists a FLOCK (a process that merely has the
    file open, such as a second run-worker, lists none). Empty where /proc does not tell."""
    try:
        target = lock_path.stat()
    except OSError:
        return []
    found = []
    for entry in _PROC.iterdir() if _PROC.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:  # gone, or another user's
            continue
        for fd in fds:
            try:
                opened = fd.stat()
                if (opened.st_dev, opened.st_ino) != (target.st_dev, target.st_ino):
                    continue
                info = (entry / "fdinfo" / fd.name).read_text()
            except OSError:
                continue
            if any(line.startswith("lock:") and " FLOCK " in line for line in info.splitlines()):
                found.append(int(entry.name))
                break
    return sorted(found)


def _parent(pid: int) -> int | None:
    try:
        return int((_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _refusal(folder: Path, holding: list[int]) -> str:
    """What a second run-worker says: who holds the var/, and whom to stop (the holders
    whose parent is not one: the script, or its qcluster once the script is gone)."""
    lock_path = folder / LOCK_FILE
    if holding:
        roots = [pid for pid in holding if _parent(pid) not in holding]
        many = len(holding) > 1
        who = f"pid{'s' if many else ''} {', '.join(map(str, holding))} hold{'' if many else 's'}"
        target = " ".join(map(str, roots))
    else:  # no /proc, or processes this user cannot see
        recorded = _recorded(folder / PID_FILE)
        alive = recorded is not None and _pid_alive(recorded)
        who = f"run-worker pid {recorded} holds" if alive else "a process not visible here holds"
        target = str(recorded) if alive else "<its pid>"
    return (
        f"run-worker: a worker already runs on {folder} ({who} {lock_path}); stop it first "
        f"(Ctrl-C in its terminal, or kill {target}), or give this one another WORKER_VAR_DIR"
    )


def _recorded(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None


def release(pid: int, folder: Path | None = None) -> None:
    """Remove `pid`'s record (another worker's is left alone). The lock itself needs no
    release: it goes with the last process holding it."""
    pid_file = (folder or var_dir()) / PID_FILE
    if _recorded(pid_file) == pid:
        pid_file.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    args = argv[1:]
    usage = "usage: python -m project.worker_lock claim PID FD | release PID"
    if not args or not all(arg.isdigit() for arg in args[1:]):
        print(usage, file=sys.stderr)
        return 64
    if args[0] == "release" and len(args) == 2:
        release(int(args[1]))
        return 0
    if args[0] != "claim" or len(args) != 3:
        print(usage, file=sys.stderr)
        return 64
    try:
        claim(int(args[1]), int(args[2]))
    except Refused as exc:
        print(exc, file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"run-worker: {exc}", file=sys.stderr)
        return 64
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
