"""Store sync: the store follows the ledger after commit; a key still listed for a finished
row is cleaned up, never handled twice (inbound_email/services/store_sync.py)."""

from __future__ import annotations

import pytest

from inbound_email.models import InboundEmail, Reply
from inbound_email.poller import poll_once
from tests.support.mail import build_mail
from tests.support.stores import intake_keys, key

pytestmark = pytest.mark.django_db


def test_redelivered_object_with_the_same_key_is_handled_once(store, notification):
    mail = build_mail(token=notification.token, body="4")
    store.put(key(store, "k"), mail)
    poll_once()
    store.put(key(store, "k"), mail)  # SES redelivers the same object
    summary = poll_once()
    assert summary.outcomes["cleaned_up"] == 1
    assert InboundEmail.objects.count() == 1 and Reply.objects.count() == 1
    assert intake_keys(store) == []
