"""worker_status reports what needs an operator, and its exit code says so."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from django_q.models import Schedule
from model_bakery import baker

from inbound_email.models import InboundEmail
from jobs.models import Job, PausedKind
from ops.schedules import ensure_schedules
from processes.models import WorkerProcess
from tests.support.processes import manage_py

pytestmark = pytest.mark.django_db


def test_nothing_to_do_exits_zero(capsys):
    call_command("worker_status")
    assert "OK: nothing needs an operator." in capsys.readouterr().out


def test_stuck_job_and_quarantined_mail_are_reported_with_a_failing_exit_code(capsys):
    now = timezone.now()
    stuck = baker.make(
        Job,
        kind="report.render",
        status=Job.Status.PROCESSING,
        attempts=1,
        max_attempts=5,
        started_at=now - timedelta(minutes=10),
        lease_expires_at=now - timedelta(minutes=5),
        locked_by="host-a:123",
    )
    baker.make(Job, kind="report.render", status=Job.Status.QUEUED, max_attempts=5)
    baker.make(
        InboundEmail,
        store_key="inbound/poison-1",
        status=InboundEmail.Status.QUARANTINED,
        reason=InboundEmail.Reason.PERMANENT_ERROR,
    )

    with pytest.raises(CommandError) as excinfo:
        call_command("worker_status")
    assert excinfo.value.returncode == 1
    out = capsys.readouterr().out
    assert f"STUCK: #{stuck.pk} report.render locked by host-a:123" in out
    assert "quarantined: 1" in out
    assert "1 job(s) stuck in processing past their lease" in out
    assert "1 quarantined mail(s)" in out

    with pytest.raises(CommandError):
        call_command("worker_status", "--json")
    report = json.loads(capsys.readouterr().out)
    assert [job["id"] for job in report["stuck_jobs"]] == [stuck.pk]
    assert report["quarantined_mail"] == 1
    assert report["jobs_by_status"] == {"processing": 1, "queued": 1}
    assert len(report["needs_operator"]) == 2


def test_acknowledged_operator_replies_no_longer_alarm_and_stuck_relays_do(capsys):
    """R6: a `needs_operator` reply alarmed forever (no way to acknowledge it), and mail
    stuck in `awaiting_relay` was never reported."""
    from inbound_email.models import Reply
    from notifications.models import EmailNotification

    notification = baker.make(
        EmailNotification,
        kind="proposal_review",
        status="responded",
        ses_message_id="m-1",
        sent_at=timezone.now(),
        responded_at=timezone.now(),
    )
    acknowledged = baker.make(
        Reply,
        notification=notification,
        inbound_email=baker.make(InboundEmail, store_key="k1", status="processed"),
        relay_status="inboxed",
        needs_operator=True,
        operator_acknowledged_at=timezone.now(),
    )
    assert acknowledged.needs_operator
    call_command("worker_status")  # acknowledged: nothing to do
    assert "OK: nothing needs an operator." in capsys.readouterr().out

    stuck = baker.make(InboundEmail, store_key="k2", status="awaiting_relay")
    fresh = baker.make(InboundEmail, store_key="k3", status="awaiting_relay")
    InboundEmail.objects.filter(pk=stuck.pk).update(updated_at=timezone.now() - timedelta(hours=25))
    assert fresh.pk
    with pytest.raises(CommandError):
        call_command("worker_status", "--json")
    report = json.loads(capsys.readouterr().out)
    assert report["instructions_needing_operator"] == 0
    assert report["instruction_relays_stuck"] == 1
    [finding] = report["needs_operator"]
    assert finding.startswith("1 instruction relay(s) stuck")


def test_json_names_the_database_engine_and_where_it_is(capsys, settings):
    call_command("worker_status", "--json")
    database = json.loads(capsys.readouterr().out)["database"]
    assert database["engine"] == "postgresql"
    on_embedded = settings.DATABASES["default"]["HOST"] == str(settings.EMBEDDED_PG_DIR.resolve())
    assert database["embedded"] is on_embedded  # the local server, unless scripts/test fell back
    assert database["where"].endswith("/" + settings.DATABASES["default"]["NAME"])
    assert database["server_version"][0].isdigit()


@pytest.mark.django_db(transaction=True)
def test_needing_an_operator_ends_with_a_plain_line_and_exit_status_1(subprocess_env):
    """Issue 36.8: it ended with `CommandError: 1 finding(s) need an operator` on stderr,
    which reads like the command broke. The findings are listed, then one plain line."""
    baker.make(
        InboundEmail,
        store_key="inbound/poison-36",
        status=InboundEmail.Status.QUARANTINED,
        reason=InboundEmail.Reason.PERMANENT_ERROR,
    )

    for args in (["worker_status"], ["worker_status", "--json"]):
        result = manage_py(*args, env=subprocess_env, timeout=60)

        assert result.returncode == 1, result.stderr
        assert "1 quarantined mail(s)" in result.stdout
        assert "CommandError" not in result.stderr and "Traceback" not in result.stderr
        last = result.stderr.strip().splitlines()[-1]
        where = "in the report's needs_operator" if "--json" in args else "listed above"
        assert last == f"worker_status: 1 finding needs an operator ({where})"


# A date and time in any of the forms it printed: a space or T, seconds and fractions or not,
# a zone (UTC, +00:00, Z) or none.
_TIME = re.compile(
    r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(?::\d\d(?:\.\d+)?)?(?: ?(?:UTC|[+-]\d\d:\d\d|Z))?"
)


def test_every_time_it_prints_is_utc_and_says_so(capsys):
    """Issue 36.8: some times were cut to `2026-12-06T23:05:41` (no zone), others printed
    whole (`2026-12-06T23:05:41.123456+00:00`). One format everywhere, with its zone, as
    the admin's pages write it."""
    now = timezone.now()
    baker.make(
        Job,
        kind="report.render",
        status=Job.Status.PROCESSING,
        attempts=1,
        max_attempts=5,
        started_at=now - timedelta(minutes=10),
        lease_expires_at=now - timedelta(minutes=5),
        locked_by="host-a:123",
    )
    baker.make(PausedKind, kind="report.render", paused_by="ops")
    baker.make(
        WorkerProcess,
        role="qcluster",
        host="host-a",
        pid=123,
        version="1",
        started_at=now - timedelta(minutes=3),
        heartbeat_at=now,
        interval_seconds=10,
        gone_after=now + timedelta(seconds=30),
    )
    ensure_schedules()
    Schedule.objects.update(next_run=now + timedelta(seconds=30))

    with pytest.raises(CommandError):
        call_command("worker_status")
    out = capsys.readouterr().out

    times = _TIME.findall(out)
    assert len(times) >= 5, out  # the stuck lease, the pause, the process twice, next runs
    assert [t for t in times if not re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", t)] == []
