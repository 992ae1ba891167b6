"""Issue 19.1: django-q2 runs only the functions named in code, however a task got there."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone
from django_q import core_signing
from django_q.brokers import get_broker
from django_q.models import Failure, OrmQ, Schedule
from django_q.scheduler import scheduler
from django_q.signing import PickleSerializer, SignedPackage
from django_q.tasks import async_task
from prometheus_client.parser import text_string_to_metric_families

from ops.models import RefusedTask
from ops.status import worker_status
from ops.task_guard import ALLOWED_FUNCTIONS, GuardedOrmBroker, TaskRefused
from tests.support import import_log
from tests.support.processes import spawn_manage_py, stop_process_group

TOKEN = "task-guard-scrape-token"


class _WritesMarker:
    """A pickle that runs `touch marker` when it is unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def _task(func: str, *args: object, **extra: object) -> dict:
    return {
        "id": "f" * 32,
        "name": "hostile-task",
        "func": func,
        "args": args,
        "kwargs": {},
        "started": timezone.now(),
        **extra,
    }


def _broker_row(payload: str) -> OrmQ:
    """A row written straight into the broker table, as another database role could."""
    return OrmQ.objects.create(key=get_broker().list_key, payload=payload, lock=timezone.now())


def _signed_with_another_key(obj: object) -> str:
    return core_signing.dumps(
        obj, key="another-deployments-key-" + "k" * 40, salt="django_q", serializer=PickleSerializer
    )


def _insert_schedule_by_sql(name: str, func: str, args: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_q_schedule (name, func, args, schedule_type, repeats, minutes, "
            "next_run) VALUES (%s, %s, %s, 'I', -1, 1, now() - interval '1 minute')",
            [name, func, args],
        )


def _metric(client, settings, name: str) -> float:
    settings.METRICS_TOKEN = TOKEN
    body = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).content
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }[name]


def test_the_allowlist_is_the_code_s_own_schedules_and_tasks():
    from ops.schedules import SCHEDULES

    assert {spec.func for spec in SCHEDULES} <= ALLOWED_FUNCTIONS
    assert "jobs.tasks.run_due_jobs" in ALLOWED_FUNCTIONS
    assert "os.system" not in ALLOWED_FUNCTIONS


@pytest.mark.django_db
def test_the_broker_hands_the_pusher_only_allowed_tasks(tmp_path, client, settings):
    marker = tmp_path / "unpickled"
    allowed = _broker_row(SignedPackage.dumps(_task("jobs.tasks.reap_stale_jobs")))
    _broker_row(SignedPackage.dumps(_task("os.system", f"touch {tmp_path / 'ran'}")))
    _broker_row(SignedPackage.dumps(_task("jobs.tasks.reap_stale_jobs", hook="os.system")))
    _broker_row(_signed_with_another_key(_WritesMarker(marker)))

    broker = GuardedOrmBroker(list_key=get_broker().list_key)
    handed = [task for _ in range(5) for task in broker.dequeue() or []]  # one row a call

    assert [ack_id for ack_id, _payload in handed] == [allowed.pk]
    assert list(OrmQ.objects.values_list("pk", flat=True)) == [allowed.pk]  # refused: deleted
    assert not marker.exists()  # the foreign-key row was never unpickled
    refused = list(RefusedTask.objects.order_by("id"))
    assert [(r.source, r.func, r.hook) for r in refused] == [
        ("broker", "os.system", ""),
        ("broker", "jobs.tasks.reap_stale_jobs", "os.system"),
        ("broker", "", ""),
    ]
    assert "not a function the worker runs" in refused[0].reason
    assert "never unpickled" in refused[2].reason

    findings = worker_status().needs_operator
    assert any("3 task(s) refused" in finding for finding in findings)
    assert _metric(client, settings, "worker_tasks_refused") == 3


@pytest.mark.django_db
def test_an_unknown_function_queued_through_async_task_runs_nothing(tmp_path, caplog):
    """Q_SYNC runs the task in this process: refused at enqueue, before anything is imported."""
    marker = tmp_path / "ran"
    with pytest.raises(TaskRefused, match="refused os.system"):  # sync mode raises
        async_task("os.system", f"touch {marker}", sync=True)

    assert not marker.exists()
    refusal = RefusedTask.objects.get()
    assert (refusal.source, refusal.func) == ("enqueue", "os.system")
    errors = [r for r in caplog.records if r.name == "ops.task_guard" and r.levelname == "ERROR"]
    assert [r.action for r in errors] == ["task_refused"]


RECORDER = "tests.ops.import_recorder"  # records its own import in tests/support/import_log


@pytest.fixture
def recorder_never_imported():
    sys.modules.pop(RECORDER, None)
    import_log.IMPORTED.clear()
    yield
    sys.modules.pop(RECORDER, None)
    import_log.IMPORTED.clear()


@pytest.mark.django_db(transaction=True)  # django-q2's scheduler closes the connection
def test_a_refused_task_never_imports_the_module_it_names(recorder_never_imported):
    """Issue 28.7: the guard refused the right tasks, but one that imported the named module
    before refusing it (`pydoc.locate`, as django-q2 resolves a func) passed every test,
    and importing a module runs its code. A schedule run by django-q2's scheduler, an
    async_task, a hook and a broker row each name a module that records its own import:
    all are refused and the module is never imported."""
    Schedule.objects.create(
        name="recorder",
        func=f"{RECORDER}.run",
        schedule_type=Schedule.MINUTES,
        minutes=1,
        repeats=-1,
        next_run=timezone.now() - timedelta(minutes=1),
    )
    scheduler(broker=get_broker())  # django-q2's scheduler: the schedule is due
    with pytest.raises(TaskRefused):
        async_task(f"{RECORDER}.run", sync=True)
    with pytest.raises(TaskRefused):
        async_task("jobs.tasks.reap_stale_jobs", hook=f"{RECORDER}.hook", sync=True)
    _broker_row(SignedPackage.dumps(_task(f"{RECORDER}.run")))
    broker = GuardedOrmBroker(list_key=get_broker().list_key)
    handed = [task for _ in range(3) for task in broker.dequeue() or []]

    refused = sorted((r.source, r.func, r.hook) for r in RefusedTask.objects.all())
    assert refused == [
        ("broker", f"{RECORDER}.run", ""),
        ("enqueue", "jobs.tasks.reap_stale_jobs", f"{RECORDER}.hook"),
        ("enqueue", f"{RECORDER}.run", ""),  # the schedule
        ("enqueue", f"{RECORDER}.run", ""),  # async_task
    ]
    # What the scheduler queued is the refusal itself, never the named function.
    assert [SignedPackage.loads(payload)["func"] for _, payload in handed] == [
        "ops.task_guard.refused_task"
    ]
    assert import_log.IMPORTED == []
    assert RECORDER not in sys.modules


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_hostile_schedule_inserted_by_sql_while_the_cluster_runs_never_runs(
    subprocess_env, tmp_path, admin_client, client, settings
):
    """The acceptance test: a Schedule of os.system written by SQL into a running cluster's
    database, and a broker row signed with the deployment's key, never run; a row signed with
    another key is never unpickled; all are refused, logged and reported."""
    log = tmp_path / "qcluster.log"
    env = {**subprocess_env, "Q_WORKERS": "1", "LOG_LEVEL": "INFO", "LOG_FORMAT": "text"}
    with log.open("w") as out:
        cluster = spawn_manage_py(
            "qcluster", env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    markers = [tmp_path / "schedule-ran", tmp_path / "broker-ran", tmp_path / "unpickled"]
    try:
        deadline = time.monotonic() + 60
        while "running" not in log.read_text():
            assert cluster.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        _insert_schedule_by_sql("hostile", "os.system", repr(f"touch {markers[0]}"))
        _broker_row(SignedPackage.dumps(_task("os.system", f"touch {markers[1]}")))
        _broker_row(_signed_with_another_key(_WritesMarker(markers[2])))

        deadline = time.monotonic() + 75  # the scheduler runs every 30 s
        while RefusedTask.objects.count() < 3:
            assert cluster.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        time.sleep(2)  # a worker that did take a task would have run it by now
    finally:
        stop_process_group(cluster)

    assert [m for m in markers if m.exists()] == []
    refused = {(r.source, r.func, r.group) for r in RefusedTask.objects.all()}
    assert ("enqueue", "os.system", "hostile") in refused  # the scheduler's task
    assert ("broker", "os.system", "") in refused  # the row written past django-q2
    assert ("broker", "", "") in refused  # the foreign-key row
    # The scheduler's task ran as a refusal: django-q2 lists it as a failure saying so.
    results = [f.result for f in Failure.objects.filter(group="hostile")]
    assert results and all(r.startswith("refused os.system") for r in results), results
    assert "ERROR ops.task_guard [" in log.read_text()
    assert "task refused" in log.read_text()

    findings = worker_status().needs_operator
    assert any("task(s) refused" in f for f in findings)
    assert any("schedule 'hostile' (func os.system) is not defined in code" in f for f in findings)
    page = admin_client.get("/admin/worker-health/").content.decode()
    assert "task(s) refused" in page and "schedule &#x27;hostile&#x27;" in page
    assert _metric(client, settings, "worker_tasks_refused") >= 3
    assert _metric(client, settings, "worker_schedules_unknown") == 1


def test_a_foreign_signature_stops_the_live_pickle_these_tests_use(tmp_path):
    """The markers above mean something: the pickle does run code once unpickled, and
    django-q2 checks the signature before it unpickles (so does jobs/wake_tasks.py, through
    SignedPackage)."""
    marker = tmp_path / "unpickled"
    payload = _signed_with_another_key(_WritesMarker(marker))
    with pytest.raises(core_signing.BadSignature):
        SignedPackage.loads(payload)
    assert not marker.exists()
    assert pickle.loads(pickle.dumps(_WritesMarker(marker))) == 0  # the pickle is live
    assert marker.exists()
