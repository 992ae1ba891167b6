"""Run by tests/project/test_test_script.py as `scripts/test -n 2 --dist each` (not collected
by the suite: the name does not start with test_). Each xdist worker records its database,
the database and mail folder a child process it starts sees, and its own mail folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tests.support.processes import manage_py

CHILD = (
    "import json; from django.conf import settings; from django.db import connection; "
    "print(json.dumps([connection.settings_dict['NAME'], settings.INBOUND_EMAIL_STORE]))"
)


@pytest.mark.django_db(transaction=True)
def test_records_what_this_worker_and_its_child_see(subprocess_env):
    child = manage_py("shell", "-c", CHILD, env=subprocess_env)
    assert child.returncode == 0, child.stderr
    child_database, child_store = json.loads(child.stdout.strip().splitlines()[-1])
    worker = os.environ.get("PYTEST_XDIST_WORKER", "none")
    (Path(os.environ["PROBE_DIR"]) / f"{worker}.json").write_text(
        json.dumps(
            {
                "database": connection.settings_dict["NAME"],
                "store": settings.INBOUND_EMAIL_STORE,
                "child_database": child_database,
                "child_store": child_store,
            }
        )
    )
