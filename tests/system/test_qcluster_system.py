"""The whole worker in real processes: two `manage.py qcluster` clusters on PostgreSQL, S3 and
SES through moto's server mode, Slack through the local Slack server.

It feeds jobs, due notifications and PI replies, kills one cluster with SIGKILL mid-run, and
checks that the other one (with the reaper) finishes everything with nothing lost:
every job ran exactly once (I3/I4), every mail ended in a final state and left the intake
(I6-I10), every notification was sent once (I11/I12), every instruction was posted once (I8),
and no two processes ever minted with the same writer slot (I1/I2).
"""

from __future__ import annotations

import os
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django_q.tasks import async_task

from canonical_ids.models import Message
from inbound_email.models import InboundEmail
from jobs import enqueue
from jobs.models import Job
from notifications.models import EmailNotification, NotificationPreference, Proposal
from ops.sample_mail import reply_mail, unknown_8bit_reply
from tests.support.cluster import (
    BUCKET,
    INTAKE,
    AwsServer,
    cluster_env,
    descendants,
    spawn_cluster,
    stop_cluster,
)
from tests.support.slack_server import SlackServer
from tests.system.handlers import SYSTEM_RUN_ID

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

JOB_COUNT = 240
PI_COUNT = 6
DEADLINE_SECONDS = 150


def _wait_for(condition: Callable[[], bool], what: str, poke: Callable[[], None]) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        poke()
        time.sleep(1.0)


def _poke_jobs() -> None:
    async_task("jobs.tasks.run_due_jobs")


def _poke_everything() -> None:
    """Wake-ups through django-q2's broker, as the schedules would (minute-grained) do."""
    for func in (
        "jobs.tasks.run_due_jobs",
        "jobs.tasks.reap_stale_jobs",
        "notifications.tasks.new_proposal_sweep",
        "inbound_email.tasks.poll_inbound_email",
    ):
        async_task(func)


@pytest.fixture
def aws_server():
    with AwsServer() as aws:
        yield aws


def test_two_clusters_finish_all_work_and_survive_a_sigkill(aws_server, tmp_path):
    with SlackServer() as slack:
        env = cluster_env(aws_server, slack.base_url)
        clusters = [spawn_cluster(env, tmp_path / f"cluster{i}.log") for i in range(2)]
        try:
            _run_scenario(clusters, aws_server.s3, aws_server.ses, slack, tmp_path)
        finally:
            for cluster in clusters:
                stop_cluster(cluster)


def _run_scenario(clusters, s3, ses, slack: SlackServer, tmp_path: Path) -> None:
    victim, survivor = clusters
    User = get_user_model()

    # --- feed: PIs with due new-proposal notices, and jobs (woken by the table trigger) --------
    with transaction.atomic():
        for i in range(PI_COUNT):
            pi = User.objects.create_user(
                username=f"pi{i}", email=f"pi{i}@example.org", password=None
            )
            NotificationPreference.objects.create(user=pi)
            Proposal.objects.create(
                title=f"Proposal {i}",
                pi=pi,
                status=Proposal.Status.IN_REVIEW,
                run_id=f"run-{i}",
                slack_channel=f"C0000000{i}",
            )
        for n in range(JOB_COUNT):
            # 0.1 s each: a worker claims one job at a time (issue 22), so a job must be held
            # long enough for the poll below to see the victim holding one on a loaded host.
            enqueue("system.record", {"n": n, "sleep": 0.1})

    # --- kill one cluster while it holds a job -------------------------------------------------
    victim_pids: set[int] = set()

    def victim_holds_a_job() -> bool:
        nonlocal victim_pids
        victim_pids = descendants(victim.pid)
        owners = Job.objects.filter(status=Job.Status.PROCESSING).values_list(
            "locked_by", flat=True
        )
        return any(int(owner.split(":")[-2]) in victim_pids for owner in owners if owner)

    # Only jobs before the kill, so every notification is sent by the survivor (a kill between
    # SES and the commit may legitimately cost a duplicate mail, which would blur the count).
    _wait_for(victim_holds_a_job, "the victim cluster to claim a job", _poke_jobs)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)

    # --- notifications go out (from the survivor), then the PIs reply -------------------------
    def all_notices_sent() -> bool:
        return (
            EmailNotification.objects.filter(
                kind=EmailNotification.Kind.NEW_PROPOSAL, status=EmailNotification.Status.SENT
            ).count()
            == PI_COUNT
        )

    _wait_for(all_notices_sent, "every new-proposal notice to be sent", _poke_everything)
    notices = list(
        EmailNotification.objects.filter(kind=EmailNotification.Kind.NEW_PROPOSAL).order_by("id")
    )
    replies = {
        "instruction-0": reply_mail(
            notices[0], "Rating: 4\n\nPlease shorten the budget <!channel>.", message_id="s0"
        ),
        "instruction-1": reply_mail(
            notices[1], "Add the pilot study to the aims.", message_id="s1"
        ),
        "unknown-8bit": unknown_8bit_reply(
            notices[2], "Rating: 5\nGrüße, the budget looks fine.\n", message_id="s2"
        ),
        "string-rating": reply_mail(notices[3], "Rating: excellent", message_id="s3"),
        "auto-reply": reply_mail(
            notices[4], "I am out of office.", message_id="s4", **{"Auto-Submitted": "auto-replied"}
        ),
        "spoofed": reply_mail(
            notices[5], "Rating: 1", message_id="s5", From="mallory@evil.example"
        ),
    }
    for name, raw in replies.items():
        s3.put_object(Bucket=BUCKET, Key=f"{INTAKE}{name}.eml", Body=raw)

    def all_mail_final() -> bool:
        final = InboundEmail.objects.filter(status__in=InboundEmail.TERMINAL_STATUSES).count()
        intake = s3.list_objects_v2(Bucket=BUCKET, Prefix=INTAKE).get("KeyCount", 0)
        return final == len(replies) and intake == 0

    def all_jobs_done() -> bool:
        return not Job.objects.exclude(status=Job.Status.COMPLETED).exists()

    _wait_for(all_mail_final, "every mail to end in a final state", _poke_everything)
    _wait_for(all_jobs_done, "every job to complete after the kill", _poke_everything)
    _wait_for(lambda: len(slack.posts) >= 2, "both instructions to be posted", _poke_everything)

    # --- every job ran exactly once, including the one the killed cluster held -----------------
    system_jobs = Job.objects.filter(kind="system.record")
    assert system_jobs.filter(status=Job.Status.COMPLETED).count() == JOB_COUNT
    texts = list(Message.objects.filter(run_id=SYSTEM_RUN_ID).values_list("text", flat=True))
    assert sorted(texts) == sorted(f"job-{n}" for n in range(JOB_COUNT))
    assert system_jobs.filter(attempts__gt=1).exists(), "the killed cluster's job was reaped"

    # --- no two processes ever minted with the same writer slot --------------------------------
    pids_by_slot: dict[int, set[int]] = defaultdict(set)
    for ts, metadata in Message.objects.filter(run_id=SYSTEM_RUN_ID).values_list("ts", "metadata"):
        pids_by_slot[int(ts.split(".")[1]) % 100].add(metadata["pid"])
    assert all(len(pids) == 1 for pids in pids_by_slot.values()), pids_by_slot
    assert not set(pids_by_slot) & {1, 2, 3}
    assert len(pids_by_slot) >= 2

    # --- mail: each in its final state, the intake empty ----------------------------------------
    by_key = {Path(row.store_key).stem: row for row in InboundEmail.objects.all()}
    assert by_key["instruction-0"].status == InboundEmail.Status.PROCESSED
    assert by_key["instruction-1"].status == InboundEmail.Status.PROCESSED
    assert by_key["unknown-8bit"].status == InboundEmail.Status.PROCESSED
    assert by_key["string-rating"].status == InboundEmail.Status.REJECTED
    assert by_key["auto-reply"].status == InboundEmail.Status.REJECTED
    assert by_key["spoofed"].status == InboundEmail.Status.REJECTED
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix=INTAKE).get("KeyCount", 0) == 0

    # --- instructions posted once each, escaped; answered notices marked responded --------------
    posted = [post["text"] for post in slack.posts]
    assert len(posted) == 3
    assert any("Please shorten the budget &lt;!channel&gt;." in text for text in posted)
    assert any("Add the pilot study to the aims." in text for text in posted)
    assert any("Grüße, the budget looks fine." in text for text in posted)  # unknown-8bit
    responded = EmailNotification.objects.filter(status=EmailNotification.Status.RESPONDED)
    assert set(responded.values_list("id", flat=True)) == {
        notices[0].id,
        notices[1].id,
        notices[2].id,
    }

    # --- every notification sent exactly once ---------------------------------------------------
    sent = EmailNotification.objects.filter(status__in=EmailNotification.SENT_STATUSES)
    message_ids = list(sent.values_list("ses_message_id", flat=True))
    assert len(message_ids) == len(set(message_ids)) >= PI_COUNT
    # The moto server runs in this process: read what SES really accepted.
    accepted = AwsServer.accepted_message_ids()
    assert sorted(accepted) == sorted(message_ids)
