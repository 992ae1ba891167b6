"""`manage.py demo` walks every capability and reports it; the README's run command shows it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from django.core.management import call_command

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
        if not key.startswith(
            ("DATABASE_URL", "SECRET_KEY", "AWS_", "SLACK_", "INBOUND_EMAIL", "EMAIL_")
        )
    }  # no SECRET_KEY either (issue 19.2): the first start writes a random one under var/
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
    assert "schedules: 8 created" in output
    database = json.loads(status.stdout)["database"]
    assert database["engine"] == "postgresql"
    assert database["embedded"] is True
    assert database["where"] == f"{var_dir / 'pg'}/worker"
    assert (var_dir / "pg" / "PG_VERSION").is_file()
    assert not (var_dir / "pg" / "postmaster.pid").exists()  # stopped on exit
    key_file = var_dir / "secret_key"  # generated on the first start, private
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert len(key_file.read_text().strip()) >= 50
    shutil.rmtree(var_dir.parent)


def _embedded_env(var_dir: Path, **settings: str) -> dict[str, str]:
    """A new user's environment: the embedded PostgreSQL under `var_dir`, nothing else set."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DATABASE_URL", "AWS_", "SLACK_", "INBOUND_EMAIL", "EMAIL_"))
    }
    env["WORKER_VAR_DIR"] = str(var_dir)
    env.update(settings)
    return env


def _run(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_demo_with_the_console_backend_writes_its_mail_to_files_not_stdout():
    """The demo on the project's embedded PostgreSQL (the only database it may run on), with
    Django's console mail backend configured: the report is all stdout shows; the six
    notification mails are files under WORKER_VAR_DIR/sent_mail/."""
    # Not under pytest's basetemp: as root the embedded server runs as another user and must
    # traverse the path (see the README test above).
    var_dir = Path(tempfile.mkdtemp(prefix="worker-demo-mail-")) / "var"
    env = _embedded_env(var_dir, EMAIL_BACKEND="django.core.mail.backends.console.EmailBackend")
    user = str(os.getpid())
    try:
        _run(["-m", "project.embedded_pg", "start", "--user", user], env, timeout=180)
        try:
            _run(["manage.py", "migrate", "--no-input"], env, timeout=300)
            demo = _run(["manage.py", "demo"], env, timeout=300)
        finally:
            _run(["-m", "project.embedded_pg", "stop", "--user", user], env, timeout=120)
        _check_demo_mail(demo.stdout, var_dir / "sent_mail")
    finally:
        shutil.rmtree(var_dir.parent, ignore_errors=True)


def _check_demo_mail(out: str, outbox: Path) -> None:
    """The demo's stdout is its report alone; its mails are in `outbox`."""
    assert "Demo run" in out
    assert f"The notification mails are in {outbox}/." in out
    recipients = re.findall(r"new_proposal +to (\S+) ", out)
    assert len(recipients) == 6, out
    # Not on stdout: no message header, no recipient's mail.
    assert "Subject:" not in out and "Content-Type:" not in out and "MIME-Version" not in out
    files = sorted(outbox.glob("*.log"))
    assert files, f"no mail file in {outbox}"
    mails = "".join(path.read_text() for path in files)
    # Every mail the demo sent (the notices, then the review requests and a rejection notice
    # from its pass of the schedules) is in the files, each new-proposal notice once.
    assert mails.count("\nSubject: New proposal ready: ") == 6
    for address in recipients:
        assert f"\nTo: {address}\n" in mails
