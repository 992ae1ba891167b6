"""The embedded PostgreSQL's users file (project/embedded_pg.py), tested without a server.

Every `scripts/run-worker` (and `scripts/test` on its fallback) registers its pid as a user
of the embedded server and, on exit, stops the server only if no other live user is left.
The server is stood in for by a live process named in `postmaster.pid` (what `is_running`
reads), so no PostgreSQL is started and none could be stopped by mistake.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from project import embedded_pg


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen]]:
    """Live processes the test starts (the users, the stand-in postmaster); killed after."""
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture
def pgdata(tmp_path: Path, processes: list[subprocess.Popen]) -> Path:
    """A data folder whose postmaster.pid (the layout PostgreSQL writes) names a live pid."""
    folder = tmp_path / "pg"
    folder.mkdir()
    postmaster = _sleeper()
    processes.append(postmaster)
    lines = [
        str(postmaster.pid),
        str(folder),
        str(int(time.time())),
        "5432",
        str(folder),
        "",
        "0",
        "ready",
    ]
    (folder / "postmaster.pid").write_text("\n".join(lines) + "\n")
    return folder


def test_with_two_live_users_one_stopping_leaves_the_server_running_for_the_other(
    pgdata: Path, processes: list[subprocess.Popen]
):
    first, second = _sleeper(), _sleeper()
    processes.extend([first, second])
    assert embedded_pg.is_running(pgdata)  # the stand-in counts as a running server
    embedded_pg._update_users(pgdata, add=first.pid)
    assert embedded_pg._update_users(pgdata, add=second.pid) == sorted([first.pid, second.pid])

    stopped = embedded_pg.stop(pgdata, user=first.pid)

    assert stopped is False  # left running: the second user still uses it
    assert processes[0].poll() is None  # the postmaster was not signalled
    assert embedded_pg.is_running(pgdata)
    assert embedded_pg._update_users(pgdata) == [second.pid]  # only the first one left


def test_a_dead_user_does_not_count(pgdata: Path, processes: list[subprocess.Popen]):
    """A user killed with -9 never unregisters: it is dropped, not kept as a user forever."""
    live, killed = _sleeper(), _sleeper()
    processes.extend([live, killed])
    embedded_pg._update_users(pgdata, add=live.pid)
    embedded_pg._update_users(pgdata, add=killed.pid)

    killed.kill()
    killed.wait(timeout=10)

    assert embedded_pg._update_users(pgdata) == [live.pid]
