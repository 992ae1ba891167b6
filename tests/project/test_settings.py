"""Settings come from the environment and refuse unsafe or malformed values at start-up."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.processes import PROJECT_ROOT, child_env


def _django_setup(code: str = "", **env: str) -> subprocess.CompletedProcess:
    script = "import django; django.setup();" + code
    return subprocess.run(
        [sys.executable, "-c", script],
        env=child_env(**env),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_insecure_secret_key_is_refused_when_debug_is_off():
    result = _django_setup(DEBUG="false", SECRET_KEY="")
    assert result.returncode != 0
    assert "SECRET_KEY is the insecure development default while DEBUG is off" in result.stderr


def test_a_real_secret_key_starts_with_debug_off():
    result = _django_setup(DEBUG="false", SECRET_KEY="x" * 50)
    assert result.returncode == 0, result.stderr


def test_malformed_setting_names_the_variable():
    result = _django_setup(Q_WORKERS="three")
    assert result.returncode != 0
    assert "Q_WORKERS='three' is not a valid integer" in result.stderr

    result = _django_setup(DEBUG="maybe")
    assert "DEBUG='maybe' is not a valid boolean" in result.stderr

    result = _django_setup(DATABASE_URL="nosuchscheme://x")
    assert "DATABASE_URL is not a valid database URL" in result.stderr


def test_default_database_is_the_embedded_postgresql_socket_under_the_var_dir(tmp_path):
    env = child_env(WORKER_VAR_DIR=str(tmp_path))
    env.pop("DATABASE_URL")
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings as s; "
            "d = s.DATABASES['default']; "
            "print(d['ENGINE'], d['HOST'], d['NAME'], s.DB_IS_EMBEDDED)",
        ],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "django.db.backends.postgresql",
        str(tmp_path / "pg"),
        "worker",
        "True",
    ]


def test_a_database_other_than_postgresql_is_refused(tmp_path):
    result = _django_setup(DATABASE_URL=f"sqlite:///{tmp_path / 'worker.sqlite3'}")
    assert result.returncode != 0
    assert "the worker runs on PostgreSQL only" in result.stderr


def test_log_format_json_writes_one_json_object_per_line():
    code = (
        "import logging; logging.getLogger('jobs.runner').info("
        "'job %s completed', 7, extra={'action': 'job_completed', 'job_id': 7})"
    )
    result = _django_setup(code, LOG_FORMAT="json")
    assert result.returncode == 0, result.stderr
    line = json.loads(result.stderr.strip().splitlines()[-1])
    assert line["message"] == "job 7 completed"
    assert line["action"] == "job_completed"
    assert line["job_id"] == 7
    assert line["levelname"] == "INFO"
