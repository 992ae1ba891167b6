"""Helpers for tests that start real processes (manage.py commands, forked minters, qcluster)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from django.db import connection

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def test_database_url() -> str:
    """The URL of the database the running test uses (pytest-django's test_<name>)."""
    params = connection.settings_dict
    user = params.get("USER") or ""
    password = params.get("PASSWORD") or ""
    auth = user + (f":{password}" if password else "")
    host = params.get("HOST") or "127.0.0.1"
    if host.startswith("/"):  # the embedded server's socket folder (scripts/test's fallback)
        return f"postgres://{auth}@{quote(host, safe='')}/{params['NAME']}"
    port = params.get("PORT") or 5432
    return f"postgres://{auth}@{host}:{port}/{params['NAME']}"


def child_env(**overrides: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DATABASE_URL"] = test_database_url()
    env["DJANGO_SETTINGS_MODULE"] = "project.settings"
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    env.update(overrides)
    return env


def manage_py(
    *args: str, env: dict[str, str], timeout: float = 120, **kwargs
) -> subprocess.CompletedProcess:
    """Run `python manage.py ARGS` against the test database and return the finished process."""
    return subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "manage.py"), *args],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kwargs,
    )


def django_python(
    code: str, *, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    """Run `code` in a new Python process after `django.setup()`, from the checkout, with the
    test database's environment (`child_env()` unless `env`), output captured as text; a
    non-zero exit is returned, not raised: start-up refusals are what many callers check."""
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()\n" + code],
        env=child_env() if env is None else env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def spawn_manage_py(*args: str, env: dict[str, str], **kwargs) -> subprocess.Popen:
    """Start `python manage.py ARGS` in the background (caller must wait/kill it)."""
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(
        [sys.executable, str(PROJECT_ROOT / "manage.py"), *args],
        env=env,
        cwd=PROJECT_ROOT,
        text=True,
        **kwargs,
    )


def communicate_all(processes: list[subprocess.Popen], timeout: float) -> list[tuple[str, str]]:
    """Each process's (stdout, stderr) once it has exited; whichever is still running when
    this returns or raises (a timeout, a failed assertion) is killed, never left behind."""
    try:
        return [process.communicate(timeout=timeout) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)


def stop_process_group(process: subprocess.Popen, timeout: float = 30) -> None:
    """Stop a process started with start_new_session=True and everything it forked.

    SIGINT to the whole group is what Ctrl-C does: django-q2 then stops its workers cleanly.
    Whatever is still alive after `timeout` is SIGKILLed, group-wide, so no orphaned qcluster
    worker outlives its test and takes tasks from the next test's database.
    """
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # stragglers, even if the leader has exited
    except ProcessLookupError:
        pass
    process.wait(timeout=10)


def terminate_backends(application_name: str) -> int:
    """`pg_terminate_backend` every connection of the test database opened under
    `application_name` (children get it through PGAPPNAME); return how many were ended."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s "
            "AND pid <> pg_backend_pid()",
            [application_name],
        )
        return cursor.fetchone()[0]


def wait_until(
    condition, what: str, timeout: float = 60, interval: float = 0.1, logs: tuple = ()
) -> None:
    """Poll `condition()` until it is true; fail with `what` after `timeout` seconds, and the
    last 3,000 characters of each of `logs` (the log files of the processes waited on)."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            tails = "".join(
                f"\n--- {path.name} ends:\n{path.read_text(errors='replace')[-3000:]}"
                for path in logs
                if path.exists()
            )
            raise AssertionError(f"timed out after {timeout}s waiting for: {what}{tails}")
        time.sleep(interval)


def schedules_started_up() -> bool:
    """True once a fresh qcluster's start-up run of its schedules has passed.

    `ensure_schedules()` creates every schedule due now, so a starting cluster queues one task
    per schedule (among them `run_due_jobs`, which would start any job it finds). The run has
    passed when no schedule is due any more and every task it queued has run and been
    acknowledged: django-q2's scheduler moves `next_run` and queues the task in one
    transaction, and its ORM broker deletes a task's row only after the result was saved.
    """
    from django.utils import timezone
    from django_q.models import OrmQ, Schedule

    due = Schedule.objects.filter(next_run__lte=timezone.now()).exists()
    return not due and not OrmQ.objects.exists()


def schedules_already_run(ahead_seconds: float = 3600) -> None:
    """The minute schedules as a cluster leaves them after its start-up run, their next runs
    `ahead_seconds` away: made before a test starts its qcluster, whose `ensure_schedules()`
    then keeps them as they are (unchanged), so no start-up run of the schedules (a
    `run_due_jobs` among them) can start the test's job, and the test need not wait for
    that run: django-q2's scheduler first looks about 30 s after the cluster starts, which
    `schedules_started_up` waited out in every such test."""
    from datetime import timedelta

    from django.utils import timezone
    from django_q.models import Schedule

    from ops.schedules import ensure_schedules

    ensure_schedules()
    Schedule.objects.update(next_run=timezone.now() + timedelta(seconds=ahead_seconds))


@contextmanager
def killed_on_exit(process: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """The block's process, SIGKILLed and reaped when the block ends if it still runs (a
    test that failed half-way must not leave its worker running)."""
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
