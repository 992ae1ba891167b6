"""/metrics: off (404) without METRICS_TOKEN, 401 without the right bearer token, and
worker_status's figures in Prometheus' text format with it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from model_bakery import baker
from prometheus_client.parser import text_string_to_metric_families

from inbound_email.models import InboundEmail
from jobs import enqueue
from jobs.models import Job, KindCap
from jobs.runner_step import job_runner_step
from notifications.models import EmailNotification, SendingState
from tests.support.leases import make_lease, spare_slots

pytestmark = pytest.mark.django_db

TOKEN = "s3cret-scrape-token"


def _samples(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def test_metrics_are_off_without_a_token(client, settings):
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 404
    assert client.get("/metrics", headers={"Authorization": "Bearer "}).status_code == 404


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        f"Basic {TOKEN}",
        "Bearer wrong",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
    ],
)
def test_a_missing_or_wrong_token_is_refused(client, settings, authorization):
    settings.METRICS_TOKEN = TOKEN
    headers = {} if authorization is None else {"Authorization": authorization}
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert b"worker_" not in response.content


def test_metrics_expose_worker_status_figures(client, settings):
    settings.METRICS_TOKEN = TOKEN
    now = timezone.now()
    # Kinds with a handler in code (ops/handlers.py, inbound_email/handlers.py): since issue 19
    # any other kind is exported as "other".
    baker.make(
        Job,
        kind="demo.greet",
        status="queued",
        max_attempts=5,
        run_after=now - timedelta(minutes=10),
    )
    baker.make(
        Job,
        kind="demo.greet",
        status="processing",
        max_attempts=5,
        lease_expires_at=now - timedelta(minutes=1),
    )
    baker.make(
        Job, kind="inbound_email.relay_reply", status="failed", max_attempts=5, failed_at=now
    )
    baker.make(InboundEmail, store_key="q-1", status="quarantined")
    baker.make(EmailNotification, status="sending", claimed_at=now - timedelta(hours=2))
    [slot] = spare_slots(1)
    make_lease(slot=slot, now=now, live=True, role="bench-role")

    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = _samples(response.content)
    assert samples[("worker_jobs", (("kind", "demo.greet"), ("status", "queued")))] == 1
    relay = (("kind", "inbound_email.relay_reply"), ("status", "failed"))
    assert samples[("worker_jobs", relay)] == 1
    assert samples[("worker_jobs_stuck", ())] == 1
    assert samples[("worker_job_oldest_due_seconds", ())] >= 600
    assert samples[("worker_inbound_emails", (("status", "quarantined"),))] == 1
    assert samples[("worker_notifications", (("status", "sending"),))] == 1
    assert samples[("worker_notifications_stuck_sending", ())] == 1
    assert samples[("worker_instructions_needing_operator", ())] == 0
    assert samples[("worker_instruction_relays_stuck", ())] == 0
    assert samples[("worker_writer_slot_leases", (("role", "bench-role"),))] == 1
    # stuck job, failed job, backlog, quarantined mail, stuck sending
    assert samples[("worker_needs_operator_findings", ())] == 5


def test_metrics_only_answer_get(client, settings):
    settings.METRICS_TOKEN = TOKEN
    response = client.post("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 405


def test_every_documented_alert_rule_uses_an_exported_metric(client, settings):
    """docs/operations.md's example rules: one per worker_status exit reason, each on a metric
    /metrics really exports (a renamed metric would silently never fire)."""
    import re
    from pathlib import Path

    import yaml

    settings.METRICS_TOKEN = TOKEN
    body = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).content
    exported = {family.name for family in text_string_to_metric_families(body.decode())}

    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = doc.split("### Alert rules", 1)[1]
    rules_yaml = section.split("```yaml", 1)[1].split("```", 1)[0]
    rules = yaml.safe_load(rules_yaml)["groups"][0]["rules"]

    used = {name for rule in rules for name in re.findall(r"\bworker_[a-z_]+", rule["expr"])}
    assert used and used <= exported, used - exported
    # worker_status's eleven exit reasons (issue 19 added refused tasks and unknown schedules,
    # issue 23 the bounce / complaint rate, issue 20 an overdue schedule), plus the scrape
    assert len(rules) == 12


def test_a_disabled_endpoint_answers_a_plain_404_even_with_debug_on(client, settings):
    """Issue 19.9: never Django's DEBUG 404 page (it lists every URL pattern)."""
    settings.METRICS_TOKEN = ""
    settings.DEBUG = True
    for method in (client.get, client.head):
        response = method("/metrics")
        assert response.status_code == 404
        assert response["Content-Type"] == "text/plain"
        assert response.content in (b"Not Found\n", b"")  # HEAD: no body


def test_post_answers_405_not_a_csrf_403(client, settings):
    settings.METRICS_TOKEN = TOKEN
    client.handler.enforce_csrf_checks = True  # as a browser-less scraper meets it
    response = client.post("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 405
    assert response["Allow"] == "GET, HEAD"


@pytest.mark.django_db(transaction=True)
def test_twenty_thousand_inserted_kinds_stay_one_other_series(client, settings):
    """Issue 19.9: labels come from bounded sets: kinds registered in code, the rest `other`
    (before: one series per distinct kind ever inserted, 20,001 series for 20,000 kinds)."""
    from django.db import connection

    settings.METRICS_TOKEN = TOKEN
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
            "run_after, created_at, locked_by, last_error) "
            "SELECT 'hostile.' || i, '{}', CASE WHEN i % 2 = 0 THEN 'queued' ELSE 'cancelled' END, "
            "0, 0, 5, now() + interval '1 hour', now(), '', '' "
            "FROM generate_series(1, 20000) AS i"
        )
    baker.make(
        Job, kind="demo.greet", status="completed", max_attempts=5, completed_at=timezone.now()
    )

    body = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).content
    series = {
        labels: value for (name, labels), value in _samples(body).items() if name == "worker_jobs"
    }
    assert series == {
        (("kind", "demo.greet"), ("status", "completed")): 1,
        (("kind", "other"), ("status", "cancelled")): 10000,
        (("kind", "other"), ("status", "queued")): 10000,
    }


def test_metrics_show_the_sending_pause(client, settings):
    """Issue 23: a daily-quota pause of all sending is visible to Prometheus."""
    settings.METRICS_TOKEN = TOKEN
    headers = {"Authorization": f"Bearer {TOKEN}"}
    before = _samples(client.get("/metrics", headers=headers).content)
    assert before[("worker_notifications_sending_paused", ())] == 0
    until = timezone.now() + timedelta(minutes=15)
    SendingState.objects.create(
        pk=1,
        paused_until=until,
        paused_at=timezone.now(),
        max_send_rate=14.0,
        pause_reason="SES Throttling: Daily message quota exceeded.",
    )

    samples = _samples(client.get("/metrics", headers=headers).content)

    assert samples[("worker_notifications_sending_paused", ())] == 1
    assert samples[("worker_notifications_sending_paused_until_seconds", ())] == pytest.approx(
        until.timestamp()
    )
    assert samples[("worker_notifications_max_send_rate", ())] == 14.0


def test_metrics_show_the_bounce_and_complaint_rates_of_the_last_24_hours(client, settings):
    """Issue 23: 200 mails sent in the last 24 h, 4 hard bounces (one older: not counted) and
    1 complaint: 2 % and 0.5 %."""
    from notifications.suppression import feedback_record

    settings.METRICS_TOKEN = TOKEN
    now = timezone.now()
    baker.make(
        EmailNotification,
        status="sent",
        sent_at=now - timedelta(hours=1),
        ses_message_id="m",
        _quantity=200,
    )
    for i in range(4):
        feedback_record(
            address=f"b{i}@example.net", kind="hard_bounce", source="dsn", report="", now=now
        )
    feedback_record(
        address="old@example.net",
        kind="hard_bounce",
        source="dsn",
        report="",
        now=now - timedelta(hours=25),
    )
    feedback_record(address="c@example.net", kind="complaint", source="arf", report="", now=now)

    samples = _samples(client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).content)

    assert samples[("worker_notifications_bounce_rate", ())] == pytest.approx(0.02)
    assert samples[("worker_notifications_complaint_rate", ())] == pytest.approx(0.005)
    assert samples[("worker_notifications_suppressed_addresses", ())] == 6
    # 0.5 % complaints is over SES's 0.1 % review rate: worker_status says so.
    assert samples[("worker_needs_operator_findings", ())] == 1


def test_metrics_show_each_kinds_cap_and_its_units_in_use(client, settings):
    """Issue 37, points 2 and 10: a cap per kind for the whole deployment."""
    settings.METRICS_TOKEN = TOKEN
    KindCap.objects.create(kind="demo.greet", concurrency=3)
    enqueue("demo.greet")
    enqueue("demo.greet")
    assert len(job_runner_step(worker="w", claim=1).claimed) == 1
    samples = _samples(client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).content)
    assert samples[("worker_job_kind_cap", (("kind", "demo.greet"),))] == 3
    assert samples[("worker_job_kind_cap_running", (("kind", "demo.greet"),))] == 1
