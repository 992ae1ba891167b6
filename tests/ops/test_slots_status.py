"""Issue 37, point 10 (slots): a job worker's beat carries its slots (total, and in use per
kind), and worker_status, the health page and /metrics show them: per process, and per kind
over the live processes (/metrics labels by kind only, from the bounded set)."""

from __future__ import annotations

import threading
from io import StringIO

import pytest
from django.core.management import call_command
from prometheus_client.parser import text_string_to_metric_families

import tests.jobs.handlers  # noqa: F401 - registers tests.log in this process
from jobs import enqueue
from ops.status import worker_status
from processes.beacon import beacon_running
from processes.models import WorkerProcess
from tests.support.processes import wait_until
from tests.support.threads import drain_in_thread

pytestmark = pytest.mark.django_db(transaction=True)


def _slots_seen() -> dict | None:
    row = WorkerProcess.objects.filter(role="run_jobs", stopped_at__isnull=True).first()
    return row.slots if row else None


@pytest.mark.serial
def test_a_workers_slots_in_use_show_per_process_and_per_kind(
    tmp_path, settings, admin_client, client
):
    settings.JOBS_CONCURRENCY = 4
    settings.METRICS_TOKEN = "t"
    release = tmp_path / "release"
    for n in range(3):
        enqueue("tests.log", {"log": str(tmp_path / "runs.log"), "n": n, "until": str(release)})
    stop, result = threading.Event(), {}
    with beacon_running(role="run_jobs"):
        thread = drain_in_thread(result, stop=stop)
        try:
            wait_until(
                lambda: (_slots_seen() or {}).get("busy") == {"tests.log": 3},
                "the beat carrying three slots in use",
                timeout=30,
            )
            assert _slots_seen() == {"threads": 4, "async": 500, "busy": {"tests.log": 3}}

            [process] = [p for p in worker_status().processes if p["role"] == "run_jobs"]
            assert process["slots"]["text"] == "3 of 4 + 500 in use (tests.log 3)"

            out = StringIO()
            call_command("worker_status", stdout=out)
            report = out.getvalue()
            assert "slots: 3 of 4 + 500 in use (tests.log 3)" in report
            assert "Slots in use:  3 (tests.log 3)" in report

            page = admin_client.get("/admin/worker-health/?refresh=0").content.decode()
            assert "<th>slots in use</th>" in page
            assert "3 of 4 + 500 in use (tests.log 3)" in page

            body = client.get("/metrics", headers={"Authorization": "Bearer t"}).content.decode()
            families = {f.name: f for f in text_string_to_metric_families(body)}
            samples = families["worker_job_slots_in_use"].samples
            assert {s.labels["kind"]: s.value for s in samples} == {"tests.log": 3}
            total = {s.labels["pool"]: s.value for s in families["worker_job_slots"].samples}
            assert total == {"thread": 4, "async": 500}
        finally:
            stop.set()
            release.touch()
            thread.join(60)
        wait_until(
            lambda: (_slots_seen() or {}).get("busy") == {}, "the beat after the drain", timeout=30
        )
