"""The inbound ledger claim's guards, each caught by a test if it is removed (issue 14).

A poller claims a due `received` row in one committed statement that counts the attempt and
leases the row (`next_attempt_at` moved CLAIM_LEASE_SECONDS ahead), selecting it with
`FOR UPDATE SKIP LOCKED`. So concurrent pollers never wait for each other's claims, never
take a row another claim holds, and never take a leased row before its lease runs out.

Written against the public services (`inbound_email_register`, `inbound_email_handle`) as
imported from `inbound_email.services`; no private name is used. docs/architecture.md lists
the mutants these were seen failing on.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from inbound_email.conf import get_config
from inbound_email.models import InboundEmail, Reply
from inbound_email.services.intake import (
    CLAIM_LEASE_SECONDS,
    inbound_email_handle,
    inbound_email_register,
)
from tests.support.locks import LockWait, LockWaitWatcher, OpenTransaction
from tests.support.mail import build_mail
from tests.support.processes import child_env, spawn_manage_py

Status = InboundEmail.Status
MAILS = 30
POLLERS = 3


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_concurrent_pollers_handle_each_mail_once_and_never_wait_on_a_held_claim(
    folder_store, make_notification
):
    """Three `poll_inbound_email --once` processes work through one intake of 30 replies
    (each answering its own notification, so no two mails share a notification's lock) while
    a fourth poller's claim of one mail is in flight (it holds the row's lock, its UPDATE not
    yet run). No claim ever waits on a lock (sampled from another connection for the whole
    run), every other mail is handled exactly once, and the held mail is left alone (no
    attempt counted) for the next poll.

    Without SKIP LOCKED the pollers' claims queue up behind the held row; with no row lock
    at all they also wait (the UPDATE locks it) and then claim and handle it under the other
    poller's feet.
    """
    for n in range(MAILS):
        notification = make_notification(to_address=f"pi{n}@university.example")
        folder_store.put(
            f"m{n:03d}",
            build_mail(token=notification.token, sender=notification.to_address, body="4"),
        )
    # The ledger rows exist before the pollers list the intake (a previous poll registered
    # them), so the pollers' registrations conflict with nothing in flight.
    rows = inbound_email_register(objects=[obj for page in folder_store.list() for obj in page])
    held = rows["m000"]

    def other_pollers_claim() -> list[int]:
        # The claim's row lock, taken and not yet released (its UPDATE not yet run).
        return list(
            InboundEmail.objects.select_for_update().filter(pk=held.pk).values_list("pk", flat=True)
        )

    env = child_env(
        INBOUND_EMAIL_STORE=str(folder_store.root),
        SLACK_BOT_TOKEN="",
        INBOUND_EMAIL_MAX_ATTEMPTS="3",
    )
    claim = OpenTransaction(other_pollers_claim)
    watch = LockWaitWatcher(on_first_wait=claim.release, ignore=_is_registration)
    with claim, watch as watcher:
        assert claim.result == [held.pk]
        pollers = [spawn_manage_py("poll_inbound_email", "--once", env=env) for _ in range(POLLERS)]
        try:
            outputs = [poller.communicate(timeout=180) for poller in pollers]
        finally:
            for poller in pollers:
                if poller.poll() is None:
                    poller.kill()
                    poller.wait(timeout=10)
    assert [poller.returncode for poller in pollers] == [0] * POLLERS, outputs

    assert watcher.waits == [], "a poller waited on a row lock:\n" + watcher.report()
    summaries = [json.loads(out.strip().splitlines()[-1]) for out, _err in outputs]
    assert sum(summary["handled"] for summary in summaries) == MAILS - 1
    replies = Counter(Reply.objects.values_list("inbound_email__store_key", flat=True))
    assert sorted(replies) == [f"m{n:03d}" for n in range(1, MAILS)]
    assert set(replies.values()) == {1}, "a mail was handled more than once"
    assert set(InboundEmail.objects.exclude(pk=held.pk).values_list("status", "attempts")) == {
        (Status.PROCESSED, 1)
    }
    held.refresh_from_db()
    assert (held.status, held.attempts) == (Status.RECEIVED, 0), "the held mail was claimed"

    # Released, the held mail is the next poll's like any other.
    assert inbound_email_handle(inbound_email_id=held.pk, store=folder_store).status == (
        Status.PROCESSED
    )
    assert Reply.objects.filter(inbound_email=held).count() == 1


def _is_registration(wait: LockWait) -> bool:
    """The ledger registration (INSERT .. ON CONFLICT DO NOTHING of every listed key) waits
    for another poller's handling transaction that has updated one of those rows: a wait
    between pollers that is not the claim's (see the report of issue 14)."""
    return wait.query.lstrip().upper().startswith("INSERT INTO")


@pytest.mark.django_db
def test_a_leased_row_is_not_claimed_again_before_its_lease_runs_out(folder_store, notification):
    """Another poller claimed the mail a minute ago (attempt counted, leased for
    CLAIM_LEASE_SECONDS) and is still on it, or died on it. Until the lease runs out a claim
    returns nothing and counts no attempt; afterwards the mail is claimed and handled."""
    folder_store.put("m", build_mail(token=notification.token, body="5"))
    [row] = inbound_email_register(
        objects=[obj for page in folder_store.list() for obj in page]
    ).values()
    claimed_at = timezone.now() - timedelta(minutes=1)
    InboundEmail.objects.filter(pk=row.pk).update(
        attempts=1, next_attempt_at=claimed_at + timedelta(seconds=CLAIM_LEASE_SECONDS)
    )

    assert inbound_email_handle(inbound_email_id=row.pk, store=folder_store) is None
    row.refresh_from_db()
    assert (row.status, row.attempts) == (Status.RECEIVED, 1)
    assert not Reply.objects.exists()

    InboundEmail.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now())  # lease over
    outcome = inbound_email_handle(inbound_email_id=row.pk, store=folder_store)
    assert outcome is not None and outcome.status == Status.PROCESSED
    row.refresh_from_db()
    assert row.attempts == 2
    assert Reply.objects.get().rating == 5


@pytest.mark.django_db
def test_a_leased_row_on_its_last_attempt_is_not_quarantined_before_its_lease_runs_out(
    folder_store, notification
):
    """Another poller has just claimed the mail's last attempt (attempts spent, lease live)
    and is about to handle it. A second poller must leave it alone, not quarantine it as
    "gave up": the last attempt would never run. Once the lease is over with no outcome (the
    first poller died on it), the mail is quarantined for too many attempts."""
    folder_store.put("m", build_mail(token=notification.token, body="5"))
    [row] = inbound_email_register(
        objects=[obj for page in folder_store.list() for obj in page]
    ).values()
    spent = get_config().max_attempts
    InboundEmail.objects.filter(pk=row.pk).update(
        attempts=spent, next_attempt_at=timezone.now() + timedelta(seconds=CLAIM_LEASE_SECONDS)
    )

    assert inbound_email_handle(inbound_email_id=row.pk, store=folder_store) is None
    row.refresh_from_db()
    assert (row.status, row.attempts, row.quarantine_key) == (Status.RECEIVED, spent, "")

    InboundEmail.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now())  # lease over
    outcome = inbound_email_handle(inbound_email_id=row.pk, store=folder_store)
    assert outcome is not None and outcome.status == Status.QUARANTINED
    row.refresh_from_db()
    assert row.reason == InboundEmail.Reason.TOO_MANY_ATTEMPTS
