"""Issue 32, point 4: an operator sees a long transaction coming.

While any session keeps a transaction (and its snapshot) open, PostgreSQL removes no dead
row version; the queue's tables bloat and enqueues slow down. worker_status, the Worker
health page and /metrics show the oldest open transaction on the database and its age;
after OPS_LONG_TRANSACTION_ALERT_SECONDS (5 minutes) it is on the list of what needs an
operator, naming the session: application name, client address, query start.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from prometheus_client.parser import text_string_to_metric_families

from ops.status import worker_status
from tests.support.browser import log_in, make_staff
from tests.support.sessions import other_session

APP = "quarterly-report"


@pytest.fixture
def long_report() -> Iterator[psycopg.Connection]:
    """Another session holding a REPEATABLE READ snapshot, as a report would."""
    conn = other_session(application_name=APP)
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    conn.execute("SELECT count(*) FROM jobs_job").fetchone()
    try:
        yield conn
    finally:
        conn.rollback()
        conn.close()


@pytest.mark.django_db
def test_worker_status_names_the_oldest_open_transaction_and_pages_after_five_minutes(
    long_report,
):
    status = worker_status()
    oldest = status.oldest_transaction
    assert oldest is not None
    assert (oldest["application_name"], oldest["client_addr"]) == (APP, "127.0.0.1")
    assert oldest["holds_snapshot"] is True
    assert 0 <= oldest["age_seconds"] < 60
    # Only this test's session's finding counts: whatever else needs an operator (rows or
    # sessions another test left) is not this test's (issue 36: one finding too many).
    assert not [f for f in status.needs_operator if APP in f]

    later = worker_status(now=status.now + timedelta(minutes=6))
    [finding] = [f for f in later.needs_operator if APP in f]
    assert "a transaction has been open" in finding and "127.0.0.1" in finding
    assert oldest["query_start"][:19].replace("T", " ") + " UTC" in finding
    assert "6 min" in finding

    out = StringIO()
    call_command("worker_status", stdout=out)  # nothing needs an operator yet: exit 0
    assert f"oldest transaction: {APP} from 127.0.0.1" in out.getvalue()


@pytest.mark.django_db
def test_no_other_transaction_open_shows_none():
    assert worker_status().oldest_transaction is None


@pytest.mark.django_db
def test_metrics_export_the_age_of_the_oldest_transaction(client, settings, long_report):
    settings.METRICS_TOKEN = "t"
    time.sleep(0.2)
    body = client.get("/metrics", headers={"Authorization": "Bearer t"}).content.decode()
    families = {f.name: f for f in text_string_to_metric_families(body)}
    [sample] = families["worker_database_oldest_transaction_seconds"].samples
    assert sample.value >= 0.2


@pytest.mark.django_db(transaction=True)
def test_the_health_page_shows_the_long_transaction_and_the_finding(
    page, live_server, django_user_model, screenshot, settings, long_report
):
    settings.OPS_LONG_TRANSACTION_ALERT_SECONDS = 1
    time.sleep(1.5)
    user = make_staff(django_user_model, username="ops", permissions=["jobs.view_job"])
    log_in(page, user, "/admin/worker-health/?refresh=0")
    line = page.locator("#oldest-transaction")
    assert APP in line.inner_text() and "127.0.0.1" in line.inner_text()
    findings = page.locator("#needs-operator").inner_text()
    assert "transaction" in findings and APP in findings
    screenshot(page, "long-transaction")
