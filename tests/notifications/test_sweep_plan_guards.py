"""The notification claim's concurrency guard, caught by a test if it is removed (issue 14).

A sweep claims a due `pending` row (`sending`, claimed_at, attempt counted) in its batch
transaction, and only after that commit does the mail leave (claim before send, I12). The
claim selects its rows with `FOR UPDATE SKIP LOCKED`: a row another transaction is claiming
right now is skipped, never waited for, and never claimed a second time (which would send
the mail twice). docs/architecture.md lists the mutants this was seen failing on.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.db.models import F
from django.utils import timezone
from model_bakery import baker

from notifications.models import EmailNotification
from notifications.sweeps import sweep_new_proposals
from tests.support.locks import LockWaitWatcher, OpenTransaction

Status = EmailNotification.Status


@pytest.mark.django_db(transaction=True)
def test_sweep_skips_a_row_another_claim_holds_without_waiting_and_sends_the_rest_once(make_pi):
    """Three PIs each have a notice due for a retry. While the sweep runs, another worker's
    claim of the second PI's notice is in flight (row locked and flipped to `sending`, not
    committed). The sweep sends the other two once each, does not wait on that lock (sampled
    from another connection), and leaves the other claim's row as that claim wrote it.

    Without SKIP LOCKED the sweep waits for the other transaction; with no row lock at all
    it also waits (its UPDATE locks the row) and then claims and sends the mail the other
    worker is already sending.
    """
    pis = [make_pi() for _ in range(3)]
    rows = [
        baker.make(
            EmailNotification,
            user=pi,
            kind=EmailNotification.Kind.NEW_PROPOSAL,
            proposal=pi.proposals.get(),
            to_address=pi.email,
            status=Status.PENDING,
            attempts=1,
            last_error="throttled",
        )
        for pi in pis
    ]
    taken = rows[1]
    other_claimed_at = timezone.now() - timedelta(seconds=1)

    def other_workers_claim() -> int:
        return EmailNotification.objects.filter(pk=taken.pk, status=Status.PENDING).update(
            status=Status.SENDING, claimed_at=other_claimed_at, attempts=F("attempts") + 1
        )

    claim = OpenTransaction(other_workers_claim)
    with claim, LockWaitWatcher(on_first_wait=claim.release) as watcher:
        assert claim.result == 1
        summary = sweep_new_proposals()

    assert watcher.waits == [], "the sweep waited on a row lock:\n" + watcher.report()
    assert sorted(message.to[0] for message in mail.outbox) == sorted(
        [pis[0].email, pis[2].email]
    ), "each free notice is sent once, the one being claimed elsewhere is not"
    assert summary.sent == 2
    taken.refresh_from_db()
    assert (taken.status, taken.claimed_at, taken.attempts) == (
        Status.SENDING,
        other_claimed_at,
        2,
    )
    for row in (rows[0], rows[2]):
        row.refresh_from_db()
        assert (row.status, row.attempts) == (Status.SENT, 2)
