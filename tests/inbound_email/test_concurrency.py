"""Two pollers at once never handle one object twice (claims with SKIP LOCKED)."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connection

from inbound_email.models import InboundEmail, Reply
from inbound_email.poller import poll_once
from tests.inbound_email.conftest import build_mail
from tests.support.processes import child_env, manage_py

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_pollers_at_once_handle_each_object_once(folder_store, notification, settings):
    settings.MAX_REPLIES_PER_TOKEN_PER_HOUR = 1000
    for i in range(60):
        folder_store.put(f"m{i:03d}", build_mail(token=notification.token, body="4"))
    summaries, errors = [], []
    barrier = threading.Barrier(2)

    def poller() -> None:
        try:
            barrier.wait(timeout=10)
            summaries.append(poll_once())
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=poller) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    assert sum(s.handled for s in summaries) == 60  # no object handled by both
    assert Reply.objects.count() == 60
    assert set(InboundEmail.objects.values_list("status", flat=True)) == {"processed"}
    assert all(row.attempts == 1 for row in InboundEmail.objects.all())
    assert [o for page in folder_store.list() for o in page] == []


def test_poll_command_once(folder_store, notification):
    folder_store.put("cmd", build_mail(token=notification.token, body="5"))
    result = manage_py(
        "poll_inbound_email",
        "--once",
        env=child_env(INBOUND_EMAIL_STORE=str(folder_store.root)),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["handled"] == 1 and summary["outcomes"] == {"processed": 1}
    assert InboundEmail.objects.get().status == "processed"
    assert Reply.objects.get().rating == 5
