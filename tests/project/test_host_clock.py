"""What an operator is shown about leases is judged on the database's clock (issue 22.1).

A web or worker host whose clock runs 10 minutes ahead (or behind) of the database's must
show a live job lease as live, and a live writer slot as held: the worker status, the Worker
health page, the job admin ("held by", "stuck") and the writer-slot admin ("live") once
compared the lease columns with the host's own clock. So did the freshness of the send
quota every process shares.
"""

from __future__ import annotations

import pytest
from django.contrib.admin.sites import site
from django.urls import reverse

from canonical_ids.leases import Holder, lease_acquire
from canonical_ids.models import WriterSlotLease
from jobs import enqueue
from jobs.models import Job
from jobs.runner_step import job_claim_batch
from notifications.pacing import Pacer
from notifications.senders.base import SendQuota
from ops.health import worker_health
from ops.status import worker_status
from project.db_clock import db_now
from tests.support.skew import skew_this_process

pytestmark = pytest.mark.django_db(transaction=True)

SKEW = 600  # seconds: far past the job lease (120 s) and the slot lease (60 s)


@pytest.fixture
def running_job() -> Job:
    enqueue("clock.test", {})
    [claimed] = job_claim_batch(worker="host-a:1:run", limit=1)
    return Job.objects.get(pk=claimed.id)


@pytest.fixture
def held_slot() -> WriterSlotLease:
    lease = lease_acquire(slots=[50], holder=Holder.current("worker", db_now()), ttl=60)
    return WriterSlotLease.objects.get(slot=lease.slot)


@pytest.mark.parametrize("skew", [SKEW, -SKEW], ids=["ahead", "behind"])
def test_the_worker_status_judges_leases_on_the_database_clock(
    running_job, held_slot, monkeypatch, skew
):
    skew_this_process(monkeypatch, skew)
    status = worker_status()
    assert status.stuck_jobs == []
    assert [lease["slot"] for lease in status.leases] == [held_slot.slot]


def test_the_health_page_judges_leases_on_the_database_clock(running_job, monkeypatch):
    skew_this_process(monkeypatch, SKEW)
    health = worker_health()
    assert health.status.stuck_jobs == []
    assert abs((health.generated_at - db_now()).total_seconds()) < SKEW / 2


def test_the_job_admin_shows_a_live_lease_as_live(running_job, admin_client, monkeypatch):
    skew_this_process(monkeypatch, SKEW)
    page = admin_client.get(reverse("admin:jobs_job_change", args=[running_job.pk]))
    assert page.status_code == 200
    assert page.context["stuck"] is False
    listing = admin_client.get(reverse("admin:jobs_job_changelist")).content.decode()
    assert "lease until" in listing and "lease expired" not in listing


def test_the_writer_slot_admin_shows_a_held_slot_as_live(held_slot, monkeypatch):
    skew_this_process(monkeypatch, SKEW)
    slot_admin = site._registry[WriterSlotLease]
    [row] = slot_admin.get_queryset(request=None).filter(pk=held_slot.pk)
    assert slot_admin.is_live(row) is True


class _QuotaCounter:
    """A mail service that reports its quota and counts how often it is asked."""

    def __init__(self) -> None:
        self.asked = 0

    def send(self, email):  # never called here
        raise AssertionError("no mail is sent in this test")

    def send_quota(self) -> SendQuota:
        self.asked += 1
        return SendQuota(max_send_rate=14.0, max_24_hour_send=-1, sent_last_24_hours=0)


def test_the_send_quota_one_host_read_is_fresh_for_every_host(monkeypatch):
    """SES's quota is kept in the database for every process for
    NOTIFICATION_SEND_QUOTA_REFRESH_SECONDS (600 s). It was stamped with the reading host's
    clock: read by a host 10 minutes behind, every other host found it stale and asked SES
    again."""
    service = _QuotaCounter()
    skew_this_process(monkeypatch, -SKEW)
    assert Pacer(service).rate() == 14.0
    monkeypatch.undo()  # another host, on time
    assert Pacer(service).rate() == 14.0
    assert service.asked == 1
