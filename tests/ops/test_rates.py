"""Issue 20, point 3: /metrics has rates and histograms, not only counts.

Counters and histograms (prometheus-client's CounterMetricFamily / HistogramMetricFamily)
come from series the database triggers keep in the transaction of each event, so the web
process that serves /metrics counts what every worker process did.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone
from model_bakery import baker
from prometheus_client.parser import text_string_to_metric_families

from inbound_email.models import InboundEmail, Reply
from jobs import enqueue
from jobs.models import Job
from jobs.runner import run_pending
from notifications.models import EmailNotification

pytestmark = pytest.mark.django_db

TOKEN = "rates-scrape-token"


@pytest.fixture
def scrape(client, settings):
    settings.METRICS_TOKEN = TOKEN

    def read() -> dict:
        body = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).content
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in families.values()
            for s in f.samples
        } | {("__types__", ()): {name: f.type for name, f in families.items()}}

    return read


def test_jobs_completed_failed_durations_and_waits_per_kind(scrape):
    get_user_model().objects.create(username="alice")
    now = timezone.now()
    enqueue("demo.greet", {"username": "alice"})
    enqueue("demo.greet", {"username": "alice"}, run_after=now - timedelta(seconds=10))
    enqueue("demo.duplicate_user", {"username": "alice"}, max_attempts=1)
    with connection.cursor() as cursor:  # another producer's kind nobody registered
        cursor.execute(
            "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
            "run_after, created_at, locked_by, last_error) VALUES "
            "('typo.kind', '{}', 'queued', 0, 0, 1, now(), now(), '', '')"
        )
    assert run_pending().claimed == 4

    m = scrape()
    types = m[("__types__", ())]
    assert types["worker_jobs_completed"] == "counter"
    assert types["worker_job_duration_seconds"] == "histogram"
    assert m[("worker_jobs_completed_total", (("kind", "demo.greet"),))] == 2
    assert m[("worker_jobs_failed_total", (("kind", "demo.duplicate_user"),))] == 1
    assert m[("worker_job_attempts_failed_total", (("kind", "other"),))] == 1
    rates = [key for key in m if key[0].startswith(("worker_jobs_", "worker_job_"))]
    assert not any("typo.kind" in str(key) for key in rates)  # labels stay bounded
    wait = "worker_job_queue_wait_seconds_bucket"
    assert m[(wait, (("kind", "demo.greet"), ("le", "5")))] == 1
    assert m[(wait, (("kind", "demo.greet"), ("le", "15")))] == 2
    assert m[("worker_job_queue_wait_seconds_count", (("kind", "demo.greet"),))] == 2
    assert m[("worker_job_queue_wait_seconds_sum", (("kind", "demo.greet"),))] >= 10
    assert m[("worker_job_duration_seconds_count", (("kind", "demo.greet"),))] == 2
    assert m[("worker_job_duration_seconds_bucket", (("kind", "demo.greet"), ("le", "+Inf")))] == 2

    # Counters never go down: pruning or deleting rows leaves them as they were.
    Job.objects.all().delete()
    assert scrape()[("worker_jobs_completed_total", (("kind", "demo.greet"),))] == 2


def test_mail_notifications_and_relays_are_counted_by_outcome(scrape):
    mail = baker.make(InboundEmail, store_key="inbound/1", status=InboundEmail.Status.RECEIVED)
    InboundEmail.objects.filter(pk=mail.pk).update(status=InboundEmail.Status.PROCESSED)
    baker.make(InboundEmail, store_key="inbound/2", status=InboundEmail.Status.QUARANTINED)
    note = baker.make(EmailNotification, kind="proposal_review", status="pending")
    EmailNotification.objects.filter(pk=note.pk).update(
        status="sent", ses_message_id="m-1", sent_at=timezone.now()
    )
    baker.make(EmailNotification, kind="digest", status="failed")
    reply = baker.make(Reply, notification=note, inbound_email=mail, relay_status="pending")
    Reply.objects.filter(pk=reply.pk).update(relay_status="posted")

    m = scrape()
    assert m[("worker_inbound_mail_total", (("outcome", "processed"),))] == 1
    assert m[("worker_inbound_mail_total", (("outcome", "quarantined"),))] == 1
    assert m[("worker_notifications_sent_total", (("kind", "proposal_review"),))] == 1
    assert m[("worker_notifications_failed_total", (("kind", "digest"),))] == 1
    assert m[("worker_instruction_relays_total", (("outcome", "posted"),))] == 1


def test_a_rolled_back_event_is_not_counted(scrape):
    from django.db import transaction

    mail = baker.make(InboundEmail, store_key="inbound/1", status=InboundEmail.Status.RECEIVED)
    with pytest.raises(RuntimeError), transaction.atomic():
        InboundEmail.objects.filter(pk=mail.pk).update(status=InboundEmail.Status.PROCESSED)
        raise RuntimeError("the handler failed after the update")
    assert ("worker_inbound_mail_total", (("outcome", "processed"),)) not in scrape()


def test_the_sample_grafana_dashboard_uses_only_exported_metrics(scrape):
    """docs/grafana-dashboard.json: every series it queries exists (a renamed metric would
    leave a panel silently empty)."""
    import json
    import re
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"
    dashboard = json.loads(path.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {name for expr in exprs for name in re.findall(r"\bworker_[a-z_]+", expr)}
    families = set(scrape()[("__types__", ())])
    suffixes = ("_total", "_bucket", "_count", "_sum")
    bare = {next((n[: -len(s)] for s in suffixes if n.endswith(s)), n) for n in used}
    assert bare <= families, bare - families
    assert {"worker_job_duration_seconds", "worker_job_queue_wait_seconds"} <= bare
