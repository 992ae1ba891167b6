"""Operators see the rates per kind (issue 38, point 3): the admin's list of rates (read-only:
code is the source) with each kind's next token, worker_status, the health page and
/metrics."""

from __future__ import annotations

import json
import re

import pytest
from django.core.management import call_command
from django.urls import reverse

from jobs import enqueue
from jobs.models import KindRate
from jobs.runner_step import job_runner_step

pytestmark = pytest.mark.django_db


@pytest.fixture
def limited_and_waiting():
    KindRate.objects.create(kind="tests.rated", rate="5/s", interval_seconds=0.2)
    KindRate.objects.create(kind="tests.rated_hourly", rate="1/h", interval_seconds=3600)
    for _ in range(3):
        enqueue("tests.rated_hourly")
    assert len(job_runner_step(worker="w", claim=5).claimed) == 1  # one token an hour


def test_the_admin_lists_each_rate_with_its_next_token_and_does_not_edit_it(
    admin_client, limited_and_waiting
):
    page = admin_client.get(reverse("admin:jobs_kindrate_changelist")).content.decode()
    cells = page.split("tests.rated_hourly", 1)[1].split("</tr>", 1)[0]
    assert re.search(r"<td class=\"field-rate_shown\"><span [^>]*>1/h</span></td>", cells), cells
    assert '<td class="field-queued">2</td>' in cells
    assert re.search(r'class="field-next_slot_at[^"]*">\d{4}-\d\d-\d\d ', cells), cells
    assert admin_client.get(reverse("admin:jobs_kindrate_add")).status_code == 403


def test_worker_status_the_health_page_and_metrics_show_each_rate(
    admin_client, client, settings, capsys, limited_and_waiting
):
    call_command("worker_status")
    out = capsys.readouterr().out
    assert "RATE: tests.rated_hourly at most 1/h (next token in 59 min)" in out
    assert "RATE: tests.rated at most 5/s (a token is there)" in out
    call_command("worker_status", "--json")
    report = json.loads(capsys.readouterr().out)
    rates = {r["kind"]: r for r in report["kind_rates"]}
    assert rates["tests.rated"]["rate"] == "5/s"
    assert 3590 < rates["tests.rated_hourly"]["next_token_in_seconds"] <= 3600
    health = admin_client.get(reverse("ops:worker_health")).content.decode()
    assert 'id="kind-rates"' in health
    assert ">tests.rated_hourly</a> 1/h" in health

    settings.METRICS_TOKEN = "t" * 40
    metrics = client.get("/metrics", headers={"Authorization": f"Bearer {'t' * 40}"})
    text = metrics.content.decode()
    assert 'worker_job_kind_rate_per_second{kind="tests.rated"} 5.0' in text
