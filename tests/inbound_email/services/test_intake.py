"""The per-token rate limit holds across pollers (issue 15, guard 4).

The intake counts a notification's recent replies under that notification's row lock, so
a second poller handling another reply to the same notification waits, then counts the
first one. Two threads with their own database connections poll one folder in lockstep: a
store wrapper holds each `get()` until both pollers are inside a mail, so every round hands
both of them a reply to the same notification at the same moment.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connection

from inbound_email.models import InboundEmail, Reply
from inbound_email.poller import poll_once
from tests.support.mail import build_mail

Status = InboundEmail.Status
Reason = InboundEmail.Reason
ROUNDS = 4  # notifications; two replies each, limit one per hour


class LockstepStore:
    """Our folder store whose reads wait until the other poller is reading too."""

    def __init__(self, inner, barrier: threading.Barrier) -> None:
        self.inner = inner
        self.barrier = barrier
        self.description = inner.description

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get(self, key: str) -> bytes:
        self.barrier.wait(timeout=30)
        return self.inner.get(key)


@pytest.mark.django_db(transaction=True)
def test_two_pollers_at_once_never_let_a_token_past_its_hourly_limit(
    folder_store, make_notification, settings
):
    """Mutant: the notification lookup without select_for_update (the count is then racy)."""
    settings.MAX_REPLIES_PER_TOKEN_PER_HOUR = 1
    notifications = [make_notification() for _ in range(ROUNDS)]
    for n, notification in enumerate(notifications):
        for copy in "ab":  # keys sort so that each round's two mails answer one notification
            folder_store.put(
                f"r{n}{copy}", build_mail(token=notification.token, body=f"{n % 5 + 1}")
            )
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def poller() -> None:
        try:
            poll_once(store=LockstepStore(folder_store, barrier))
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)
            barrier.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=poller) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert errors == []
    assert not barrier.broken  # every read was paired: the pollers really ran side by side
    replies = Counter(Reply.objects.values_list("notification_id", flat=True))
    assert replies == Counter({n.pk: 1 for n in notifications})  # one each, never two
    outcomes = Counter(InboundEmail.objects.values_list("status", "reason"))
    assert outcomes == {
        (Status.PROCESSED, ""): ROUNDS,
        (Status.REJECTED, Reason.RATE_LIMITED): ROUNDS,
    }
