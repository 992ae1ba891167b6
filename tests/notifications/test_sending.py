"""I12: no phantom sends. A row is `sent` only with the message id of an accepted mail; a
crash between the claim and the mail service costs at most a duplicate, never the mail."""

from __future__ import annotations

import signal
import socket
import time
from datetime import timedelta

import boto3
import pytest
from botocore.stub import Stubber
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from notifications.models import EmailNotification, SweepLease
from notifications.senders.ses import SesEmailSender
from notifications.sending import notification_reconcile_stale_claims
from notifications.sweeps import sweep_new_proposals, sweep_proposal_reviews
from project.db_clock import db_now
from tests.support import processes

Status = EmailNotification.Status


@pytest.mark.django_db(transaction=True)
def test_ses_rejection_leaves_no_phantom_sent_and_next_cycle_sends_once(
    make_pi, ses_unverified, settings
):
    """Defect V4: the old sweep flushed status="sent" before calling SES, so a refused send
    left a phantom `sent` row (a review request blocked for good, a notice lost).

    SES (moto) really refuses: our sender identity is not verified (MessageRejected).
    """
    pi = make_pi()
    now = timezone.now()
    first = sweep_proposal_reviews(now=now)

    assert (first.sent, first.failed) == (0, 1)
    row = EmailNotification.objects.get(user=pi)
    assert row.status == Status.PENDING
    assert (row.ses_message_id, row.sent_at, row.claimed_at) == ("", None, None)
    assert row.attempts == 1 and "MessageRejected" in row.last_error
    assert not EmailNotification.objects.filter(status=Status.SENT).exists()
    assert ses_unverified.messages == []

    # Not retried before its backoff, then sent exactly once when SES accepts.
    ses_unverified.verify_sender()
    assert sweep_proposal_reviews(now=now + timedelta(seconds=1)).sent == 0
    # The backoff runs from when the refusal was recorded (the sweep's clock advances while it
    # works, which on a loaded machine is seconds): at least the base delay after `now`.
    assert row.retry_after >= now + timedelta(seconds=settings.NOTIFICATION_RETRY_BASE_SECONDS)
    later = row.retry_after + timedelta(seconds=1)
    assert sweep_proposal_reviews(now=later).sent == 1
    assert sweep_proposal_reviews(now=later + timedelta(minutes=5)).sent == 0
    row.refresh_from_db()
    assert row.status == Status.SENT and row.attempts == 2 and row.last_error == ""
    assert [m.id for m in ses_unverified.messages] == [row.ses_message_id]
    assert ses_unverified.recipients() == [pi.email]


@pytest.mark.django_db(transaction=True)
def test_refused_send_retries_then_fails_after_max_attempts(make_pi, aws_env, settings):
    """V4: an error answered at the client (botocore Stubber): pending with backoff, then failed.

    (A `Throttling` answer no longer does this: it is the rate or the daily quota, and costs
    no attempt; see test_pacing.py.)"""
    settings.NOTIFICATION_SEND_MAX_ATTEMPTS = 2
    settings.NOTIFICATION_SEND_RATE = 1e6  # the stub answers sends only, not GetSendQuota
    pi = make_pi()
    client = boto3.client("ses", region_name="us-east-1")
    stubber = Stubber(client)
    for _ in range(2):
        stubber.add_client_error(
            "send_raw_email", "MailFromDomainNotVerifiedException", "MAIL FROM not verified."
        )
    sender = SesEmailSender(client=client)
    now = timezone.now()
    with stubber:
        first = sweep_new_proposals(now=now, sender=sender)
        row = EmailNotification.objects.get(user=pi)
        assert (first.failed, row.status, row.attempts) == (1, Status.PENDING, 1)
        backoff = timedelta(seconds=settings.NOTIFICATION_RETRY_BASE_SECONDS)
        assert now + backoff <= row.retry_after < now + backoff + timedelta(seconds=5)
        second = sweep_new_proposals(now=now + timedelta(hours=1), sender=sender)
        stubber.assert_no_pending_responses()
    row.refresh_from_db()
    assert (second.failed, row.status, row.attempts) == (1, Status.FAILED, 2)
    assert "MailFromDomainNotVerified" in row.last_error and row.ses_message_id == ""
    # A failed notice is final and visible; it is not retried.
    assert sweep_new_proposals(now=now + timedelta(hours=2), sender=sender).users == 0


def _silent_endpoint() -> socket.socket:
    """A TCP endpoint that accepts connections and never answers: SES hangs mid-call."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    return listener


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_crash_between_claim_and_ses_is_reconciled_without_losing_the_mail(make_pi, ses, settings):
    """V4: a worker killed (-9) while SES holds the call leaves the row `sending`; the next
    cycle after the claim timeout hands it back and sends it once. (The killed worker's sweep
    lease runs out first: a second of it here, NOTIFICATION_SWEEP_LEASE_SECONDS.)"""
    pi = make_pi()
    listener = _silent_endpoint()
    env = processes.child_env(
        EMAIL_SENDER="ses",
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{listener.getsockname()[1]}",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        NOTIFICATION_SWEEP_LEASE_SECONDS="1",
    )
    child = processes.spawn_manage_py("run_sweeps", "--once", "--sweep", "new_proposal", env=env)
    try:
        deadline = time.monotonic() + 60
        while not EmailNotification.objects.filter(user=pi, status=Status.SENDING).exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the child never claimed the row"
            time.sleep(0.05)
        listener.settimeout(60)
        try:  # the SES call is in flight once the child has connected to "SES"
            call, _ = listener.accept()
        except TimeoutError:
            raise AssertionError("the child never called SES") from None
        child.send_signal(signal.SIGKILL)  # the call still unanswered
        child.wait(timeout=10)
        call.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
        child.stdout.close()
        child.stderr.close()
        listener.close()

    row = EmailNotification.objects.get(user=pi)
    assert row.status == Status.SENDING and row.ses_message_id == ""
    claimed_at = row.claimed_at
    processes.wait_until(
        lambda: not SweepLease.objects.filter(expires_at__gt=db_now()).exists(),
        "the killed worker's sweep lease to run out",
        timeout=30,
    )

    # Within the timeout the claim belongs to the (possibly slow) worker: left alone.
    summary = sweep_new_proposals(now=claimed_at + timedelta(seconds=10))
    assert not summary.busy and summary.sent == 0
    assert EmailNotification.objects.get(pk=row.pk).status == Status.SENDING

    timeout = timedelta(seconds=settings.NOTIFICATION_CLAIM_TIMEOUT_SECONDS + 1)
    summary = sweep_new_proposals(now=claimed_at + timeout)
    assert (summary.reconciled, summary.sent) == (1, 1)
    row.refresh_from_db()
    assert row.status == Status.SENT and row.attempts == 2
    assert ses.recipients() == [pi.email]
    assert sweep_new_proposals(now=claimed_at + 2 * timeout).sent == 0
    assert len(ses.messages) == 1


@pytest.mark.django_db
def test_stale_claim_with_spent_attempts_is_marked_failed(make_pi, settings):
    pi = make_pi()
    now = timezone.now()
    row = EmailNotification.objects.create(
        user=pi,
        kind="new_proposal",
        proposal=pi.proposals.get(),
        status=Status.SENDING,
        claimed_at=now - timedelta(hours=2),
        attempts=settings.NOTIFICATION_SEND_MAX_ATTEMPTS,
    )
    assert notification_reconcile_stale_claims(kind="new_proposal", now=now) == 1
    row.refresh_from_db()
    assert row.status == Status.FAILED and "claim timed out" in row.last_error


@pytest.mark.django_db
def test_a_row_is_never_sent_without_a_message_id(make_pi):
    """The database refuses `sent` without ses_message_id and sent_at (I12)."""
    pi = make_pi()
    row = EmailNotification.objects.create(
        user=pi, kind="new_proposal", proposal=pi.proposals.get()
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        EmailNotification.objects.filter(pk=row.pk).update(
            status=Status.SENT, sent_at=timezone.now()
        )


@pytest.mark.django_db
def test_delivery_out_of_claim_time_hands_claims_back_unspent(make_pi, settings):
    """A slow mail service must not let claims age into another worker's reconciler."""
    pis = [make_pi(), make_pi()]
    settings.NOTIFICATION_CLAIM_TIMEOUT_SECONDS = 0  # every claim is already over budget
    summary = sweep_new_proposals()
    assert (summary.sent, summary.released) == (0, 2)
    rows = EmailNotification.objects.filter(user__in=pis)
    assert {(row.status, row.attempts, row.claimed_at) for row in rows} == {
        (Status.PENDING, 0, None)
    }
    settings.NOTIFICATION_CLAIM_TIMEOUT_SECONDS = 900
    assert sweep_new_proposals().sent == 2


@pytest.mark.django_db
def test_failed_review_request_is_not_recreated_until_an_operator_retries(
    make_pi, ses_unverified, settings, admin_client
):
    """A bad address must not loop (fail, new request, fail, ...); the admin retries it."""
    settings.NOTIFICATION_SEND_MAX_ATTEMPTS = 1
    pi = make_pi()
    now = timezone.now()
    assert sweep_proposal_reviews(now=now).failed == 1
    assert sweep_proposal_reviews(now=now + timedelta(days=1)).users == 0
    row = EmailNotification.objects.get(user=pi)
    assert row.status == Status.FAILED
    admin_client.post(
        reverse("admin:notifications_emailnotification_changelist"),
        {"action": "retry_failed", "_selected_action": [row.pk]},
    )
    ses_unverified.verify_sender()
    assert sweep_proposal_reviews(now=now + timedelta(days=2)).sent == 1
    assert EmailNotification.objects.get(user=pi).status == Status.SENT
