"""/metrics: off (404) without METRICS_TOKEN, 401 without the right bearer token, and
worker_status's figures in Prometheus' text format with it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from model_bakery import baker
from prometheus_client.parser import text_string_to_metric_families

from inbound_email.models import InboundEmail
from jobs.models import Job
from notifications.models import EmailNotification
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
    baker.make(
        Job,
        kind="report.render",
        status="queued",
        max_attempts=5,
        run_after=now - timedelta(minutes=10),
    )
    baker.make(
        Job,
        kind="report.render",
        status="processing",
        max_attempts=5,
        lease_expires_at=now - timedelta(minutes=1),
    )
    baker.make(Job, kind="mail.relay", status="failed", max_attempts=5, failed_at=now)
    baker.make(InboundEmail, store_key="q-1", status="quarantined")
    baker.make(EmailNotification, status="sending", claimed_at=now - timedelta(hours=2))
    [slot] = spare_slots(1)
    make_lease(slot=slot, now=now, live=True, role="bench-role")

    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = _samples(response.content)
    assert samples[("worker_jobs", (("kind", "report.render"), ("status", "queued")))] == 1
    assert samples[("worker_jobs", (("kind", "mail.relay"), ("status", "failed")))] == 1
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
    # worker_status's eight exit reasons (an overdue schedule since issue 20), plus the scrape
    assert len(rules) == 9
