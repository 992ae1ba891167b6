"""`manage.py poll_inbound_email` (the loop mode) against lost database connections (D3)."""

from __future__ import annotations

import signal
import subprocess

import pytest

from inbound_email.models import InboundEmail
from tests.support.mail import build_mail
from tests.support.processes import (
    child_env,
    spawn_manage_py,
    terminate_backends,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

APP_NAME = "test-poll-loop"


def _final(name: str) -> bool:
    return InboundEmail.objects.filter(
        store_key__endswith=name, status__in=InboundEmail.TERMINAL_STATUSES
    ).exists()


def test_d3_poller_survives_terminated_backends_and_stops_on_sigterm(tmp_path, make_notification):
    """D3: after `pg_terminate_backend` the loop exited with `OperationalError: terminating
    connection`. It must reconnect, handle a mail dropped afterwards, and stop on SIGTERM."""
    mail = tmp_path / "intake"
    mail.mkdir()
    env = child_env(
        INBOUND_EMAIL_STORE=str(mail),
        JOBS_WAKE_ON_COMMIT="false",
        PGAPPNAME=APP_NAME,
    )
    first, second = make_notification(), make_notification()
    (mail / "before.eml").write_bytes(build_mail(token=first.token, body="4"))
    poller = spawn_manage_py(
        "poll_inbound_email", "--interval", "1", env=env, stderr=subprocess.STDOUT
    )
    try:
        wait_until(lambda: _final("before.eml"), "the mail dropped before the fault", timeout=60)

        for _ in range(3):
            wait_until(lambda: terminate_backends(APP_NAME) > 0, "the poller's connection")
        (mail / "after.eml").write_bytes(build_mail(token=second.token, body="5"))
        wait_until(lambda: _final("after.eml"), "the mail dropped after the fault", timeout=60)
        assert poller.poll() is None, "the loop exited"
    finally:
        if poller.poll() is None:
            poller.send_signal(signal.SIGTERM)
        output, _ = poller.communicate(timeout=60)

    assert poller.returncode == 0, output
    assert "SIGTERM: stopped" in output
    assert "database connection lost" in output
    assert not list(mail.glob("*.eml"))  # both out of the intake
    assert InboundEmail.objects.get(store_key__endswith="after.eml").status == "processed"
