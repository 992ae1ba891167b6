"""Operator actions on the ledger and replies (inbound_email/services/actions.py)."""

from __future__ import annotations

import pytest

from inbound_email.models import Reply
from inbound_email.poller import poll_once
from tests.support.mail import build_mail

pytestmark = pytest.mark.django_db


def test_acknowledge_only_takes_replies_that_need_an_operator(folder_store, notification):
    """R6: acknowledging touches only replies that need an operator."""
    from inbound_email.services import reply_acknowledge

    folder_store.put("m", build_mail(token=notification.token, body="5"))
    poll_once()
    reply = Reply.objects.get()
    assert reply_acknowledge(reply_ids=[reply.pk]) == 0
    reply.refresh_from_db()
    assert reply.operator_acknowledged_at is None
