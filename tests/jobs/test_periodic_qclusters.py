"""Issue 38, point 4: two real qclusters, one schedule every second: one job per tick, run."""

from __future__ import annotations

import subprocess

import pytest
from django.db import connection

from jobs.models import Job
from tests.support.processes import spawn_manage_py, stop_process_group, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _ticks() -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tick_at, job_id FROM jobs_periodic_tick "
            "WHERE schedule = 'tests.every_second' ORDER BY tick_at"
        )
        return cursor.fetchall()


def test_two_qclusters_enqueue_each_tick_of_a_declared_schedule_once(subprocess_env, tmp_path):
    env = {
        **subprocess_env,
        "Q_WORKERS": "1",
        "LOG_LEVEL": "INFO",
        "LOG_FORMAT": "text",
        "JOBS_EXTRA_HANDLER_MODULES": "tests.jobs.handlers,tests.jobs.periodic_handlers",
    }
    clusters, logs = [], [tmp_path / "a.log", tmp_path / "b.log"]
    try:
        for log in logs:
            with log.open("w") as out:
                clusters.append(
                    spawn_manage_py(
                        "qcluster",
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        wait_until(lambda: len(_ticks()) >= 6, "six ticks of tests.every_second", timeout=90)
    finally:
        for cluster in clusters:
            stop_process_group(cluster)
    ticks = _ticks()
    assert len({tick for tick, _ in ticks}) == len(ticks)
    job_ids = [job_id for _, job_id in ticks]
    assert None not in job_ids
    assert Job.objects.filter(kind="tests.noop").count() == len(ticks)
    assert Job.objects.filter(pk__in=job_ids, status=Job.Status.COMPLETED).count() >= len(ticks) - 2
    enqueued_by = [log.read_text().count("periodic tests.every_second: tick") for log in logs]
    assert sum(enqueued_by) == len(ticks), enqueued_by
