"""Config errors stop start-up with one line naming the variable and the fix (issue 19, 7):
manage.py (project/cli.py) runs the system checks, the database's included, before a command
that needs the database, and prints each error on one line; a traceback only on request."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.processes import PROJECT_ROOT, stop_process_group

pytestmark = pytest.mark.slow

COMMANDS = [
    ("qcluster",),
    ("migrate", "--no-input"),
    ("runserver", "127.0.0.1:0"),
    ("worker_status",),
]


def manage_py(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    """manage.py in a session of its own, stopped with all it forked: a qcluster that wrongly
    starts must not outlive the test."""
    process = subprocess.Popen(
        [sys.executable, str(PROJECT_ROOT / "manage.py"), *args],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_process_group(process)
        raise
    finally:
        stop_process_group(process)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _one_line(result) -> str:
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode != 0, result.stdout + result.stderr
    assert len(lines) == 1, result.stdout + result.stderr
    assert "Traceback" not in lines[0]
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_an_unreachable_database_url_is_one_line(subprocess_env, command):
    subprocess_env["DATABASE_URL"] = "postgres://worker:secret-pw@127.0.0.1:1/worker"

    line = _one_line(manage_py(*command, env=subprocess_env, timeout=60))

    assert "DATABASE_URL" in line
    assert "127.0.0.1:1" in line
    assert "secret-pw" not in line  # the password is never printed


def test_a_database_that_does_not_exist_is_one_line(subprocess_env):
    subprocess_env["DATABASE_URL"] = subprocess_env["DATABASE_URL"].rsplit("/", 1)[0] + "/nodb_x"

    line = _one_line(manage_py("qcluster", env=subprocess_env, timeout=60))

    assert "DATABASE_URL" in line and "nodb_x" in line


def test_a_malformed_database_url_is_one_line(subprocess_env):
    subprocess_env["DATABASE_URL"] = "mysql://worker@db/worker"

    line = _one_line(manage_py("qcluster", env=subprocess_env, timeout=60))

    assert "DATABASE_URL" in line


def test_the_embedded_server_down_is_one_line_with_the_fix(subprocess_env):
    del subprocess_env["DATABASE_URL"]
    subprocess_env["WORKER_VAR_DIR"] = str(Path(tempfile.mkdtemp(prefix="wpg-down-")) / "var")

    line = _one_line(manage_py("worker_status", env=subprocess_env, timeout=60))

    assert "embedded PostgreSQL" in line
    assert "scripts/run-worker" in line and "DATABASE_URL" in line


@pytest.mark.parametrize(
    "env",
    [
        {"EMAIL_SENDER": "ses"},
        {"SLACK_BOT_TOKEN": "not-a-slack-token"},
        {"INBOUND_EMAIL_STORE": "s3://"},
        {"INBOUND_EMAIL_STORE": "s3:/bucket/inbound"},
    ],
    ids=["ses-no-region", "slack-token", "store-no-bucket", "store-scheme"],
)
def test_a_config_error_stops_qcluster_with_one_line_naming_the_variable(subprocess_env, env):
    for name in [key for key in subprocess_env if key.startswith("AWS_")]:
        del subprocess_env[name]
    subprocess_env["AWS_CONFIG_FILE"] = "/nonexistent"  # no region from ~/.aws/config
    subprocess_env.update(env)

    line = _one_line(manage_py("qcluster", env=subprocess_env, timeout=60))

    assert next(iter(env)) in line


def test_manage_py_check_finds_them_too(subprocess_env):
    subprocess_env.update(EMAIL_SENDER="ses", AWS_CONFIG_FILE="/nonexistent")
    for name in [key for key in subprocess_env if key.startswith("AWS_") and "CONFIG" not in key]:
        del subprocess_env[name]
    subprocess_env["DATABASE_URL"] = "postgres://worker@127.0.0.1:1/worker"

    result = manage_py("check", "--database", "default", env=subprocess_env, timeout=60)

    assert result.returncode != 0
    assert "EMAIL_SENDER" in result.stderr
    assert "DATABASE_URL" in result.stderr


@pytest.mark.parametrize("how", ["-v 3", "LOG_LEVEL=DEBUG"])
def test_a_traceback_only_when_asked_for(subprocess_env, how):
    subprocess_env["DATABASE_URL"] = "postgres://worker@127.0.0.1:1/worker"
    args = ["worker_status"]
    if how.startswith("-v"):
        args += how.split()
    else:
        subprocess_env["LOG_LEVEL"] = "DEBUG"

    result = manage_py(*args, env=subprocess_env, timeout=60)

    assert result.returncode != 0
    assert "Traceback" in result.stderr
    assert "DATABASE_URL" in result.stderr


# --- issue 31, point 7: start-up in the order a newcomer can act on ------------------------


def test_without_secret_key_an_unreachable_database_is_reported_first(subprocess_env):
    """It said SECRET_KEY first: the newcomer set a key, and only then learnt that the
    database URL was wrong. The database comes first, then the key."""
    del subprocess_env["SECRET_KEY"]
    subprocess_env["DATABASE_URL"] = "postgres://worker:secret-pw@127.0.0.1:1/worker"

    result = manage_py("migrate", "--no-input", env=subprocess_env, timeout=60)

    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, result.stderr
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("configuration error (ops.E002): DATABASE_URL: cannot connect to")
    assert "127.0.0.1:1" in lines[0] and "secret-pw" not in lines[0]
    assert lines[1].startswith("configuration error: SECRET_KEY is not set")


@pytest.mark.parametrize("url", ["notaurl", "localhost:5432/worker"])
def test_a_database_url_that_is_not_a_url_is_one_line_without_a_library_warning(
    subprocess_env, url
):
    subprocess_env["DATABASE_URL"] = url

    line = _one_line(manage_py("migrate", "--no-input", env=subprocess_env, timeout=60))

    assert line == (
        "configuration error: DATABASE_URL is not a valid database URL: use "
        "postgres://user:password@host:5432/dbname, or unset it for the embedded PostgreSQL"
    )


def _without_a_terminal(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """manage.py with stdin not a terminal (a script, a CI job, a pipe)."""
    return subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "manage.py"), *args],
        cwd=PROJECT_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_createsuperuser_without_a_terminal_says_what_to_run_instead(subprocess_env):
    """Django skips it without a terminal and exits 0 with no user: the printed next step
    seemed to work and the login then failed."""
    result = _without_a_terminal(subprocess_env, "createsuperuser")

    assert result.returncode == 1
    assert result.stderr.strip() == (
        "createsuperuser: no terminal to ask for the password; without one run: "
        "DJANGO_SUPERUSER_PASSWORD='choose-one' .venv/bin/python manage.py createsuperuser "
        "--no-input --username admin --email admin@localhost"
    )


def test_the_command_printed_without_a_terminal_works_as_pasted_from_any_shell(subprocess_env):
    """Issue 36.8: it said `python manage.py …`, which fails as pasted (no `python`, or one
    without Django). Printed in another folder, it names the checkout and the venv's python;
    pasted in a shell without the venv and elsewhere, it makes the user."""
    from django.contrib.auth import get_user_model

    printed = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "manage.py"), "createsuperuser"],
        cwd="/",
        env=subprocess_env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert printed.returncode == 1
    command = printed.stderr.strip().split("without one run: ", 1)[1]
    assert command.startswith(f"cd {PROJECT_ROOT} && "), command
    shell_env = {k: v for k, v in subprocess_env.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    shell_env["PATH"] = "/usr/bin:/bin"

    pasted = subprocess.run(
        ["bash", "-c", command],
        cwd="/tmp",
        env=shell_env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert pasted.returncode == 0, pasted.stderr
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser and admin.check_password("choose-one")


def test_createsuperuser_as_printed_for_no_terminal_makes_the_user(subprocess_env):
    from django.contrib.auth import get_user_model

    env = {**subprocess_env, "DJANGO_SUPERUSER_PASSWORD": "choose-one"}
    result = _without_a_terminal(
        env, "createsuperuser", "--no-input", "--username", "admin", "--email", "admin@localhost"
    )

    assert result.returncode == 0, result.stderr
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser and admin.check_password("choose-one")


def test_the_embedded_server_down_hint_is_a_command_that_starts_it(subprocess_env):
    """Issue 31.5: the hint said `python -m project.embedded_pg start`, which from another
    folder, or with a Python without the project's packages, failed or asked for a pip
    install into that Python. The hint is now a command to paste in any shell."""
    from project import embedded_pg

    del subprocess_env["DATABASE_URL"]
    var_dir = Path(tempfile.mkdtemp(prefix="wpg-hint-")) / "var"
    subprocess_env["WORKER_VAR_DIR"] = str(var_dir)
    line = _one_line(manage_py("worker_status", env=subprocess_env, timeout=60))
    command = line.split("paste: ", 1)[1].split(";", 1)[0]
    shell_env = {
        "PATH": ":".join(p for p in subprocess_env["PATH"].split(":") if ".venv" not in p),
        "HOME": subprocess_env.get("HOME", "/root"),
    }
    if "WORKER_PG_SYSTEM_DIR" in subprocess_env:
        # The machine's setting, as a shell there has it: the test process's own system
        # folder (tests/conftest.py), which forget() below cleans.
        shell_env["WORKER_PG_SYSTEM_DIR"] = subprocess_env["WORKER_PG_SYSTEM_DIR"]
    try:
        started = subprocess.run(
            ["sh", "-c", command],
            cwd="/",
            env=shell_env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert started.returncode == 0, f"{command}\n{started.stderr}"
        assert embedded_pg.is_running(var_dir / "pg")
    finally:
        embedded_pg.stop(var_dir / "pg")
        embedded_pg.forget(var_dir / "pg")
