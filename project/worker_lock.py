"""One worker per var/ (issue 31, point 4).

`scripts/run-worker` claims its var/ before anything else: a second run-worker on the same
var/ (the same mail folders, the same embedded database, the same demo marker) quietly
started a second full worker. Now it says which run-worker holds it and exits 1.

The holder's pid is in `var/worker.pid`; a claim reads and writes it under an exclusive
lock on `var/worker.lock`, so two starts at once cannot both win. A holder that died
without releasing (kill -9, a reboot) does not count: its pid must be alive and, where
/proc tells, still a run-worker (pids are reused). Like embedded_pg, this module must not
import Django: the script runs it before any setting exists.

    python -m project.worker_lock claim PID    # exit 1, naming the holder, if one runs
    python -m project.worker_lock release PID  # only PID's own claim is removed
"""

from __future__ import annotations

import contextlib
import fcntl
import sys
from collections.abc import Iterator
from pathlib import Path

from project.embedded_pg import _pid_alive, var_dir

PID_FILE = "worker.pid"
LOCK_FILE = "worker.lock"
SCRIPT = b"run-worker"  # what a holder's command line must name (Linux)


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[Path]:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with (folder / LOCK_FILE).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield folder / PID_FILE
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _is_worker(pid: int) -> bool:
    if not _pid_alive(pid):
        return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not Path("/proc/self/cmdline").exists():
        return True  # no /proc (macOS): a live pid is taken as the worker
    try:
        return SCRIPT in cmdline.read_bytes()
    except OSError:
        return False


def _holder(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().split()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None
    return pid


def claim(pid: int, folder: Path | None = None) -> int | None:
    """Record `pid` as this var/'s worker; return the live holder's pid instead if another
    run-worker holds it (nothing is written then)."""
    with _locked(folder or var_dir()) as pid_file:
        holder = _holder(pid_file)
        if holder is not None and holder != pid and _is_worker(holder):
            return holder
        pid_file.write_text(f"{pid}\n")
    return None


def release(pid: int, folder: Path | None = None) -> None:
    """Remove `pid`'s claim (another worker's claim is left alone)."""
    folder = folder or var_dir()
    if not folder.is_dir():
        return
    with _locked(folder) as pid_file:
        if _holder(pid_file) == pid:
            pid_file.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in {"claim", "release"} or not argv[2].isdigit():
        print("usage: python -m project.worker_lock claim|release PID", file=sys.stderr)
        return 64
    pid = int(argv[2])
    if argv[1] == "release":
        release(pid)
        return 0
    holder = claim(pid)
    if holder is not None:
        print(
            f"run-worker: a worker already runs on {var_dir()} (run-worker pid {holder}); "
            f"stop it first (Ctrl-C in its terminal, or kill {holder}), or give this one "
            "another WORKER_VAR_DIR",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
