"""Run by tests/project/test_test_script.py through two `scripts/test` at once (not collected
by the suite: the name does not start with test_). Each run writes its database name, waits
until the other run wrote too, then uses its database: runs that shared one would fail here."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import connection


@pytest.mark.django_db(transaction=True)
def test_holds_its_own_database_while_the_other_run_does():
    probe_dir = Path(os.environ["PROBE_DIR"])
    (probe_dir / f"{os.getpid()}.name").write_text(connection.settings_dict["NAME"])
    get_user_model().objects.create(username=f"probe-{os.getpid()}")
    deadline = time.monotonic() + 120
    while len(list(probe_dir.glob("*.name"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)
    assert len(list(probe_dir.glob("*.name"))) == 2
    assert list(get_user_model().objects.values_list("username", flat=True)) == [
        f"probe-{os.getpid()}"
    ]
