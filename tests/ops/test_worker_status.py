"""worker_status reports what needs an operator, and its exit code says so."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from model_bakery import baker

from inbound_email.models import InboundEmail
from jobs.models import Job

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
