"""Operators see the caps per kind (issue 37, points 2 and 10): the admin's list of caps
(read-only: code is the source), worker_status and the health page, each with the units in
use now."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.urls import reverse

from jobs import enqueue
from jobs.models import KindCap
from jobs.runner_step import job_runner_step

pytestmark = pytest.mark.django_db


@pytest.fixture
def capped_and_busy():
    KindCap.objects.create(kind="tests.capped", concurrency=2)
    for _ in range(3):
        enqueue("tests.capped", {"n": 1})
    assert len(job_runner_step(worker="w", claim=1).claimed) == 1


def test_the_admin_lists_each_cap_with_its_units_in_use_and_does_not_edit_it(
    admin_client, capped_and_busy
):
    page = admin_client.get(reverse("admin:jobs_kindcap_changelist")).content.decode()
    assert "tests.capped" in page
    cells = page.split("tests.capped", 1)[1].split("</tr>", 1)[0]
    assert '<td class="field-concurrency">2</td>' in cells
    assert '<td class="field-running">1</td>' in cells
    assert "add" not in reverse("admin:jobs_kindcap_changelist")
    assert admin_client.get(reverse("admin:jobs_kindcap_add")).status_code == 403


def test_worker_status_and_the_health_page_show_each_cap(admin_client, capsys, capped_and_busy):
    call_command("worker_status")
    assert "CAP: tests.capped at most 2 at once (1 running)" in capsys.readouterr().out
    call_command("worker_status", "--json")
    report = json.loads(capsys.readouterr().out)
    assert report["kind_caps"] == [{"kind": "tests.capped", "concurrency": 2, "running": 1}]
    health = admin_client.get(reverse("ops:worker_health")).content.decode()
    assert 'id="kind-caps"' in health
    assert ">tests.capped</a> 1/2" in health
