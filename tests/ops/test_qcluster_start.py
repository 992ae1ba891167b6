"""A qcluster starts without a warning: its main process forks django-q2's sentinel (and
the workers) after `ensure_schedules()` has used the database, so a connection opened
before the fork must not be shared with the children. It was: the wake-up listener's
first wake task went through the inherited connection, which a child had closed, and
every start logged "job wake-up listener: failed (… server closed the connection
unexpectedly); reconnecting"."""

from __future__ import annotations

import subprocess

import pytest

from jobs import enqueue
from jobs.models import Job
from tests.jobs import handlers  # noqa: F401 - registers tests.noop in this process
from tests.support.processes import spawn_manage_py, stop_process_group, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_qcluster_starts_and_wakes_a_worker_without_a_warning(subprocess_env, tmp_path):
    log = tmp_path / "qcluster.log"
    env = {
        **subprocess_env,
        "Q_WORKERS": "1",
        "LOG_LEVEL": "INFO",
        "LOG_FORMAT": "text",
        "JOBS_EXTRA_HANDLER_MODULES": "tests.jobs.handlers",
    }
    with log.open("w") as out:
        cluster = spawn_manage_py(
            "qcluster", env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_until(lambda: "job wake-up listener connected" in log.read_text(), "listening", 60)
        job = enqueue("tests.noop", {})  # its NOTIFY: the listener sends a wake task
        wait_until(
            lambda: Job.objects.get(id=job.id).status == Job.Status.COMPLETED,
            "the job run by the woken worker",
            timeout=60,
        )
        assert cluster.poll() is None, log.read_text()
    finally:
        stop_process_group(cluster)
    warnings = [
        line for line in log.read_text().splitlines() if " WARNING " in line or " ERROR " in line
    ]
    assert warnings == [], "\n".join(warnings)
