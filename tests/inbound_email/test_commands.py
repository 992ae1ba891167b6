"""The `poll_inbound_email` management command, run as a real process."""

from __future__ import annotations

import json

import pytest

from inbound_email.models import InboundEmail, Reply
from tests.support.mail import build_mail
from tests.support.processes import child_env, manage_py


@pytest.mark.django_db(transaction=True)
def test_poll_command_once(folder_store, notification):
    # A poll handles every due row, not only this test's: the table is made the test's own
    # (issue 36: in random order on xdist workers it once handled 3, rows left committed).
    InboundEmail.objects.all().delete()
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
