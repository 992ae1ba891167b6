"""The `run_sweeps` management command."""

from __future__ import annotations

import pytest
from django.core.management import call_command

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
