"""`manage.py demo` walks every capability and reports it; the README's run command shows it."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone

from jobs import run_pending
from jobs.models import Job
from notifications.models import EmailNotification, Proposal
from ops.schedules import SCHEDULES
from ops.status import worker_status
from tests.support.processes import PROJECT_ROOT, manage_py, stop_process_group
from tests.support.terminal import run_in_terminal


@pytest.mark.django_db(transaction=True)
def test_demo_reports_sends_replies_quarantine_and_retries(capsys, settings, tmp_path):
    settings.DB_IS_EMBEDDED = True  # the demo runs on the embedded database only
    settings.VAR_DIR = tmp_path
    settings.INBOUND_EMAIL_STORE = str(tmp_path / "inbound")
    call_command("demo")
    out = capsys.readouterr().out

    assert out.count("new_proposal    to ") == 6
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
    assert len(list((tmp_path / "sent_mail").iterdir())) >= 6  # the mails, not the console

    # The demo removed the cause of its failing job: the retry completes, nothing is left failed.
    Job.objects.filter(kind="demo.duplicate_user").update(run_after=timezone.now())
    run_pending()
    assert Job.objects.get(kind="demo.duplicate_user").status == Job.Status.COMPLETED
    assert worker_status().needs_operator == []


@pytest.mark.django_db(transaction=True)
def test_the_report_lists_every_mail_the_demo_sent_and_cuts_no_word(capsys, settings, tmp_path):
    """Issue 36.8: the table listed the six new-proposal notices only, while the log
    reported the review requests and the rejection notice its pass of the schedules sent;
    the failed job's error was cut mid-word ("…auth_user_username_k")."""
    settings.DB_IS_EMBEDDED = True
    settings.VAR_DIR = tmp_path
    settings.INBOUND_EMAIL_STORE = str(tmp_path / "inbound")
    call_command("demo")
    out = capsys.readouterr().out

    tag = re.search(r"Demo run (\d+):", out).group(1)
    sent = EmailNotification.objects.filter(user__username__endswith=f"-{tag}").order_by("pk")
    assert {n.kind for n in sent} >= {"new_proposal", "proposal_review", "reply_rejected"}
    rows = [line for line in out.splitlines() if re.match(r"  #\d+ [a-z_]+ +to ", line)]
    assert [row.split()[:2] for row in rows] == [[f"#{n.pk}", n.kind] for n in sent]

    error = Job.objects.get(kind="demo.duplicate_user").last_error.splitlines()[0]
    [printed] = [
        line.split("last error: ", 1)[1] for line in out.splitlines() if "last error: " in line
    ]
    assert len(error) > 100  # long enough to be cut
    assert printed.endswith("…") and len(printed) <= 100
    kept = printed.removesuffix("…")
    assert error.startswith(kept) and error[len(kept)] == " "  # cut between two words


@pytest.mark.django_db(transaction=True)
def test_demo_refuses_a_database_the_project_does_not_manage(subprocess_env, tmp_path):
    """A real DATABASE_URL (production) gets one line, a non-zero exit and no write."""
    subprocess_env["WORKER_VAR_DIR"] = str(tmp_path / "var")
    counts = (get_user_model().objects.count(), Job.objects.count(), Proposal.objects.count())

    result = manage_py("demo", env=subprocess_env)

    assert result.returncode != 0
    assert result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert "DATABASE_URL" in line and "embedded" in line
    assert counts == (
        get_user_model().objects.count(),
        Job.objects.count(),
        Proposal.objects.count(),
    )
    assert not (tmp_path / "var" / "sent_mail").exists()


@pytest.mark.django_db(transaction=True)
def test_every_next_step_the_demo_prints_works_as_printed(
    capsys, settings, tmp_path, subprocess_env, admin_client
):
    settings.DB_IS_EMBEDDED = True
    settings.VAR_DIR = tmp_path
    settings.INBOUND_EMAIL_STORE = str(tmp_path / "inbound")
    call_command("demo")
    out = capsys.readouterr().out
    steps = [line.strip()[2:] for line in out.splitlines() if line.strip().startswith("$ ")]
    urls = [word for line in out.splitlines() for word in line.split() if "://" in word]
    assert any(step.endswith("manage.py createsuperuser") for step in steps), out
    assert any(step.endswith("manage.py runserver") for step in steps), out
    assert any(step.endswith("manage.py worker_status") for step in steps), out
    assert "Worker health" in out

    # Pasted in a new terminal (any folder, no venv active): they run as printed.
    env = {k: v for k, v in subprocess_env.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env["PATH"] = "/usr/bin:/bin"
    [status_step] = [s for s in steps if s.endswith("worker_status")]
    status = subprocess.run(
        ["bash", "-c", status_step], cwd="/", env=env, capture_output=True, text=True, timeout=120
    )
    assert "Database:" in status.stdout, status.stderr
    [superuser_step] = [s for s in steps if s.endswith("createsuperuser")]
    answers = "ops-demo\nops@example.org\nA-l0ng-passphrase\nA-l0ng-passphrase\n"
    created = run_in_terminal(superuser_step, answers, env=env)
    assert "Superuser created successfully." in created, created
    assert get_user_model().objects.get(username="ops-demo").is_superuser
    # The admin pages it names answer (runserver serves these paths).
    health = [url for url in urls if "worker-health" in url]
    assert health, out
    for url in urls:
        path = "/" + url.split("://", 1)[1].split("/", 1)[1]
        assert admin_client.get(path).status_code == 200, url


def _start_worker(env: dict[str, str], log_path: Path) -> subprocess.Popen:
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [str(PROJECT_ROOT / "scripts" / "run-worker")],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(PROJECT_ROOT / ".venv" / "bin" / "python"), "manage.py", *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


# The Worker health page as a logged-in operator sees it (Django's test client, in a shell on
# the worker's own database).
HEALTH_PAGE = """
import json
from django.contrib.auth import get_user_model
from django.test import Client
user, _ = get_user_model().objects.get_or_create(
    username="health-check", defaults={"is_staff": True, "is_superuser": True}
)
client = Client(SERVER_NAME="localhost")
client.force_login(user)
page = client.get("/admin/worker-health/")
html = page.content.decode()
print(json.dumps({"status": page.status_code, "needs_operator": "Needs an operator" in html,
                  "alert_tiles": html.count("tile alert")}))
"""


def _run_until_up(
    env: dict[str, str], log_path: Path, *, health: bool = False
) -> subprocess.CompletedProcess:
    """Start scripts/run-worker, wait for the cluster, take worker_status (and the health
    page), stop it (Ctrl-C)."""
    process = _start_worker(env, log_path)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            output = log_path.read_text()
            # The listener connects last in the qcluster's own start-up (after the demo's
            # next steps are printed again on a first start).
            if "Q Cluster" in output and "running" in output and "listener connected" in output:
                if health:
                    page = _manage(env, "shell", "-c", HEALTH_PAGE)
                    assert page.returncode == 0, page.stderr
                    assert json.loads(page.stdout.strip().splitlines()[-1]) == {
                        "status": 200,
                        "needs_operator": False,
                        "alert_tiles": 0,
                    }
                return _manage(env, "worker_status", "--json")
            assert process.poll() is None, output
            time.sleep(0.5)
        raise AssertionError("qcluster did not start:\n" + log_path.read_text())
    finally:
        stop_process_group(process, timeout=60)  # Ctrl-C, as a user stops it


def test_readme_run_command_shows_the_demo_once_and_restarts_clean(tmp_path):
    """A new user's first run: no DATABASE_URL, no AWS, no Slack, no SECRET_KEY — the embedded
    PostgreSQL is initialised in a fresh folder, the demo runs once, the server stops with the
    worker. Two restarts later the demo has not run again and nothing is reported failed."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(
            ("DATABASE_URL", "SECRET_KEY", "AWS_", "SLACK_", "INBOUND_EMAIL", "EMAIL_")
        )
    }  # no SECRET_KEY either (issue 19.2): the first start writes a random one under var/
    # Not under pytest's shared basetemp: a fresh folder, as a new checkout has.
    var_dir = Path(tempfile.mkdtemp(prefix="worker-demo-")) / "var"
    env["WORKER_VAR_DIR"] = str(var_dir)
    try:
        statuses = [_run_until_up(env, tmp_path / f"run-{n}.log", health=n == 2) for n in range(3)]
        output = (tmp_path / "run-0.log").read_text()
        assert "Demo run" in output
        assert "a spoofed sender       rejected" in output
        assert f"schedules: {len(SCHEDULES)} created" in output
        for n in (1, 2):
            assert "Demo run" not in (tmp_path / f"run-{n}.log").read_text()
            assert "Next steps" not in (tmp_path / f"run-{n}.log").read_text()
        # Issue 36.8: about 20 start-up lines of the worker followed the demo's next steps
        # and pushed them off the screen: they are printed again once the cluster runs.
        again = output.index("The demo's next steps again")
        assert output.index("Demo run") < output.index("Q Cluster") < again
        assert output.index("schedules: ") < again
        assert "manage.py createsuperuser" in output[again:]
        assert "manage.py worker_status" in output[again:]
        assert not (var_dir / "demo-next-steps.txt").exists()  # once, not at every start
        first = json.loads(statuses[0].stdout)
        database = first["database"]
        assert database["engine"] == "postgresql"
        assert database["embedded"] is True
        assert database["where"] == f"{var_dir / 'pg'}/worker"
        assert (var_dir / "pg" / "PG_VERSION").is_file()
        assert not (var_dir / "pg" / "postmaster.pid").exists()  # stopped on exit
        key_file = var_dir / "secret_key"  # generated on the first start, private
        assert oct(key_file.stat().st_mode & 0o777) == "0o600"
        assert len(key_file.read_text().strip()) >= 50
        # var/ and the mail folders in it are not readable by other users.
        assert stat.S_IMODE(var_dir.stat().st_mode) & 0o077 == 0
        assert len(list((var_dir / "sent_mail").iterdir())) >= 6
        for mail_folder in (var_dir / "sent_mail", var_dir / "inbound_mail"):
            assert stat.S_IMODE(mail_folder.stat().st_mode) & 0o077 == 0
        last = json.loads(statuses[2].stdout)
        assert statuses[2].returncode == 0, statuses[2].stdout
        assert last["needs_operator"] == []
        assert "failed" not in last["jobs_by_status"]
        assert "failed" not in last["jobs_by_kind"]["demo.duplicate_user"]
        assert sum(last["jobs_by_kind"]["demo.greet"].values()) == 1  # one demo, not three
    finally:
        subprocess.run(
            [str(PROJECT_ROOT / ".venv" / "bin" / "python"), "-m", "project.embedded_pg", "stop"],
            cwd=PROJECT_ROOT,
            env=env,
            check=False,
        )
        real = (var_dir / "pg").resolve()
        if real != var_dir / "pg":
            shutil.rmtree(real, ignore_errors=True)  # as root: the data folder outside var/
        _remove_var(var_dir)


def _remove_var(var_dir: Path) -> None:
    """Remove a test's var/ and, as root, the data folder var/pg links to (outside var/)."""
    real = (var_dir / "pg").resolve()
    if real != var_dir / "pg":
        shutil.rmtree(real, ignore_errors=True)
    shutil.rmtree(var_dir.parent, ignore_errors=True)


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
        _remove_var(var_dir)


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
