"""`manage.py demo` walks every capability and reports it; the README's run command shows it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from django.core.management import call_command

from ops.schedules import SCHEDULES
from tests.support.processes import PROJECT_ROOT, stop_process_group


@pytest.mark.django_db(transaction=True)
def test_demo_reports_sends_replies_quarantine_and_retries(capsys, settings, tmp_path):
    settings.INBOUND_EMAIL_STORE = str(tmp_path / "inbound")
    call_command("demo")
    out = capsys.readouterr().out

    assert out.count("new_proposal  to ") == 6
    assert "a good rating          processed" in out
    assert "an instruction         processed" in out
    assert "charset=unknown-8bit   processed" in out
    assert "a string rating        rejected — Invalid rating" in out
    assert "an auto-reply          rejected — Auto-reply" in out
    assert "a spoofed sender       rejected — Sender is not the notified address" in out
    # Slack is off: both instructions are in the database inbox with a canonical id.
    assert "'Please add the pilot data to aim 2.'" in out
    assert "'Merci, très bien.'" in out
    assert "demo.greet           completed (attempt 1/5)" in out
    assert "demo.duplicate_user  queued (attempt 1/5), retry after" in out
    assert "last error: django.db.utils.IntegrityError" in out


def test_readme_run_command_shows_the_demo_and_starts_qcluster_on_embedded_postgres(tmp_path):
    """A new user's first run: no DATABASE_URL, no AWS, no Slack — the embedded PostgreSQL is
    initialised in a fresh folder, used, and stopped when the worker stops."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DATABASE_URL", "AWS_", "SLACK_", "INBOUND_EMAIL", "EMAIL_"))
    }
    # Not under pytest's shared basetemp: the embedded server runs as another user when root
    # and must traverse the path (pytest resets its basetemp root to 0700).
    var_dir = Path(tempfile.mkdtemp(prefix="worker-demo-")) / "var"
    env["WORKER_VAR_DIR"] = str(var_dir)
    log_path = tmp_path / "run-worker.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [str(PROJECT_ROOT / "scripts" / "run-worker")],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            output = log_path.read_text()
            if "Q Cluster" in output and "running" in output:
                status = subprocess.run(
                    [str(PROJECT_ROOT / ".venv" / "bin" / "python"), "manage.py"]
                    + ["worker_status", "--json"],
                    cwd=PROJECT_ROOT,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                break
            assert process.poll() is None, output
            time.sleep(0.5)
        else:
            raise AssertionError("qcluster did not start:\n" + log_path.read_text())
    finally:
        stop_process_group(process, timeout=60)  # Ctrl-C, as a user stops it

    output = log_path.read_text()
    assert "Demo run" in output
    assert "a spoofed sender       rejected" in output
    assert f"schedules: {len(SCHEDULES)} created" in output
    database = json.loads(status.stdout)["database"]
    assert database["engine"] == "postgresql"
    assert database["embedded"] is True
    assert database["where"] == f"{var_dir / 'pg'}/worker"
    assert (var_dir / "pg" / "PG_VERSION").is_file()
    assert not (var_dir / "pg" / "postmaster.pid").exists()  # stopped on exit
    shutil.rmtree(var_dir.parent)
