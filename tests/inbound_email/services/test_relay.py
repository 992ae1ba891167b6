"""The relay deletes the mail only after its outcome commits (issue 15, guard 1).

`reply_relay` runs inside the job runner's transaction. If that transaction then fails (the
job's lease was lost, a database error at commit), the reply is still pending and its mail
must still be in the intake, or the instruction would survive only in a rolled-back row.
"""

from __future__ import annotations

import pytest
from django.db import transaction

from canonical_ids.models import Message
from inbound_email.models import InboundEmail, Reply
from inbound_email.poller import poll_once
from inbound_email.services.relay import reply_relay
from jobs import run_pending
from notifications.models import EmailNotification
from tests.support.mail import build_mail

Status = InboundEmail.Status


class CommitFailed(Exception):
    """Stands for whatever makes the caller's transaction roll back after the relay."""


def intake_keys(store) -> list[str]:
    return [o.key for page in store.list() for o in page]


@pytest.mark.django_db(transaction=True)
def test_a_relay_whose_transaction_rolls_back_keeps_the_mail_in_the_intake(
    folder_store, notification
):
    """Mutant: calling inbound_email_finalize inside the transaction instead of on_commit."""
    folder_store.put("m", build_mail(token=notification.token, body="Please cut section 3."))
    poll_once()
    reply = Reply.objects.get()
    assert InboundEmail.objects.get().status == Status.AWAITING_RELAY

    with pytest.raises(CommitFailed), transaction.atomic():
        assert reply_relay(reply_id=reply.pk) == "inboxed"
        raise CommitFailed

    row = InboundEmail.objects.get()
    assert (row.status, row.intake_deleted) == (Status.AWAITING_RELAY, False)
    assert intake_keys(folder_store) == ["m"]
    reply.refresh_from_db()
    assert reply.relay_status == Reply.RelayStatus.PENDING
    assert not Message.objects.exists()  # the inbox insert was rolled back with it

    run_pending()  # the relay job queued at accept time: this attempt commits

    row.refresh_from_db()
    assert (row.status, row.intake_deleted) == (Status.PROCESSED, True)
    assert intake_keys(folder_store) == []
    assert Message.objects.get().text == "Please cut section 3."
    notification.refresh_from_db()
    assert notification.status == EmailNotification.Status.RESPONDED
