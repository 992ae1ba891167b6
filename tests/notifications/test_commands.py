"""The `run_sweeps` management command."""

from __future__ import annotations

import signal

import pytest
from django.core.management import call_command

from notifications.models import EmailNotification
from tests.support.processes import child_env, spawn_manage_py, wait_until

pytestmark = pytest.mark.django_db


def test_run_sweeps_once_prints_summaries(make_pi, capsys):
    make_pi()
    call_command("run_sweeps", "--once")
    out = capsys.readouterr().out
    assert "new_proposal: users=1 sent=1 failed=0 expired=0" in out
    assert "proposal_review: users=1 sent=1" in out
    assert "digest: users=0 sent=0" in out
    call_command("run_sweeps", "--once", "--sweep", "digest")
    assert capsys.readouterr().out.startswith("digest: ")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_run_sweeps_loops_until_sigterm_and_says_so(make_pi):
    """The loop mode keeps cycling (a PI added after the first cycle is still mailed) and a
    SIGTERM ends it cleanly with exit 0, as `docker stop` expects."""
    first = make_pi()
    sweeper = spawn_manage_py(
        "run_sweeps", "--interval", "0.5", "--sweep", "new_proposal", env=child_env()
    )
    try:
        wait_until(lambda: _sent_to(first), "the first cycle's mail", timeout=60)
        second = make_pi()
        wait_until(lambda: _sent_to(second), "a later cycle's mail", timeout=60)
        assert sweeper.poll() is None, "the loop exited"
    finally:
        if sweeper.poll() is None:
            sweeper.send_signal(signal.SIGTERM)
        output, errors = sweeper.communicate(timeout=60)

    assert sweeper.returncode == 0, errors
    assert output.rstrip().endswith("SIGTERM: stopped")


def _sent_to(user) -> bool:
    return EmailNotification.objects.filter(
        user=user, status=EmailNotification.Status.SENT
    ).exists()
