"""Settings come from the environment and refuse unsafe or malformed values at start-up."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.processes import PROJECT_ROOT, child_env, django_python, manage_py


def _django_setup(code: str = "", **env: str) -> subprocess.CompletedProcess:
    return django_python(code, env=child_env(**env))


DEV_KEY = "django-insecure-dev-only-never-use-in-production"  # the old DEBUG default
PLACEHOLDER = "change-me-to-a-long-random-string"  # .env.example


def _last_line(result: subprocess.CompletedProcess) -> str:
    return result.stderr.strip().splitlines()[-1]


def test_debug_defaults_to_false():
    result = _django_setup("from django.conf import settings; print(settings.DEBUG)", DEBUG="")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("debug", ["false", "true"])
@pytest.mark.parametrize(
    ("key", "why"),
    [
        (DEV_KEY, "it is a published placeholder"),
        (PLACEHOLDER, "it is a published placeholder"),
        ("django-insecure-" + "k3y" * 20, "it is a published placeholder"),
        ("short-key", "it has 9 characters, fewer than 50"),
        ("x" * 60, "it has fewer than 5 distinct characters"),
    ],
)
def test_a_weak_or_published_secret_key_stops_start_up_in_one_line(debug, key, why):
    """Issue 19.2: DEBUG on or off, the dev key, the .env.example placeholder and anything
    short are refused, and the one line says which variable and why."""
    result = _django_setup(DEBUG=debug, SECRET_KEY=key)
    assert result.returncode != 0
    assert f"SECRET_KEY is refused: {why}. Set SECRET_KEY to a long random value" in _last_line(
        result
    )


def test_without_a_secret_key_a_real_database_does_not_start():
    """A deployment with DATABASE_URL needs the key web and worker share: none is made up."""
    result = _django_setup(SECRET_KEY="")
    assert result.returncode != 0
    assert _last_line(result).endswith(
        "SECRET_KEY is not set: with DATABASE_URL, set SECRET_KEY (the same for web and "
        "worker) to a long random value (python -c 'import secrets; "
        "print(secrets.token_urlsafe(50))')"
    )


def test_a_real_secret_key_starts_with_debug_off():
    result = _django_setup(DEBUG="false", SECRET_KEY="k" * 40 + "0123456789")
    assert result.returncode == 0, result.stderr


def _embedded_default(tmp_path, code: str) -> subprocess.CompletedProcess:
    env = child_env(WORKER_VAR_DIR=str(tmp_path), SECRET_KEY="")
    env.pop("DATABASE_URL")
    return django_python(code, env=env)


def _ensure_key(tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "project.secret_key", "ensure"],
        env=child_env(WORKER_VAR_DIR=str(tmp_path)),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_the_embedded_default_uses_the_random_key_written_on_first_start(tmp_path):
    """scripts/run-worker runs `python -m project.secret_key ensure` before anything else."""
    read_key = "from django.conf import settings; print(settings.SECRET_KEY)"
    before = _embedded_default(tmp_path, read_key)
    assert before.returncode != 0
    assert "SECRET_KEY is not set and" in _last_line(before)

    assert _ensure_key(tmp_path).stdout.strip() == str(tmp_path / "secret_key")
    key_file = tmp_path / "secret_key"
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    first = _embedded_default(tmp_path, read_key)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == key_file.read_text().strip()
    assert len(first.stdout.strip()) >= 50

    _ensure_key(tmp_path)  # a second start keeps the key
    assert _embedded_default(tmp_path, read_key).stdout == first.stdout
    run_worker = (PROJECT_ROOT / "scripts" / "run-worker").read_text()
    assert "python -m project.secret_key ensure" in run_worker


def test_a_key_file_other_users_can_read_is_refused(tmp_path):
    _ensure_key(tmp_path)
    (tmp_path / "secret_key").chmod(0o644)
    result = _embedded_default(tmp_path, "")
    assert result.returncode != 0
    assert "is readable by other users: chmod 600" in _last_line(result)


def test_malformed_setting_names_the_variable():
    result = _django_setup(Q_WORKERS="three")
    assert result.returncode != 0
    assert "Q_WORKERS='three' is not a valid integer" in result.stderr

    result = _django_setup(DEBUG="maybe")
    assert "DEBUG='maybe' is not a valid boolean" in result.stderr

    result = _django_setup(DATABASE_URL="nosuchscheme://x")
    assert "DATABASE_URL is not a valid database URL" in result.stderr


def test_a_slack_timeout_under_10_seconds_is_refused_at_start_up():
    """Issue 10.3: a 1 s timeout turned slow Slack answers into repeated posts."""
    result = _django_setup(SLACK_TIMEOUT="1")
    assert result.returncode != 0
    assert "SLACK_TIMEOUT=1.0 must be >= 10" in result.stderr
    assert _django_setup(SLACK_TIMEOUT="10").returncode == 0


def test_default_database_is_the_embedded_postgresql_socket_under_the_var_dir(tmp_path):
    env = child_env(WORKER_VAR_DIR=str(tmp_path))
    env.pop("DATABASE_URL")
    result = django_python(
        "from django.conf import settings as s; d = s.DATABASES['default']; "
        "print(d['ENGINE'], d['HOST'], d['NAME'], s.DB_IS_EMBEDDED)",
        env=env,
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


DEPLOY_VARIABLES = (
    "SECURE_PROXY_SSL_HEADER",
    "SECURE_SSL_REDIRECT",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "PUBLIC_BASE_URL",  # the one-click unsubscribe link (issue 23): check --deploy warns without
)


def _env_example() -> dict[str, str]:
    lines = (PROJECT_ROOT / ".env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def test_check_deploy_prints_no_warning_with_the_production_settings_of_env_example():
    """Issue 19.3: .env.example's HTTPS settings and PUBLIC_BASE_URL (with a real key) make
    `check --deploy` clean; without them it warns, so the variables are what does it."""
    example = _env_example()
    https = {name: example[name] for name in DEPLOY_VARIABLES}
    key = "k" * 40 + "0123456789"
    env = child_env(DEBUG=example["DEBUG"], SECRET_KEY=key, **https)
    result = manage_py("check", "--deploy", env=env)
    assert result.returncode == 0, result.stderr
    assert "WARNINGS" not in result.stderr + result.stdout
    assert "System check identified no issues (0 silenced)." in result.stdout

    bare = manage_py("check", "--deploy", env=child_env(DEBUG="false", SECRET_KEY=key))
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in bare.stderr


def test_the_https_settings_come_from_the_environment():
    code = (
        "from django.conf import settings as s; print(s.SECURE_PROXY_SSL_HEADER, "
        "s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, s.SESSION_COOKIE_SECURE, "
        "s.CSRF_COOKIE_SECURE)"
    )
    result = _django_setup(
        code,
        SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto:https",
        SECURE_SSL_REDIRECT="true",
        SECURE_HSTS_SECONDS="600",
        SESSION_COOKIE_SECURE="true",
        CSRF_COOKIE_SECURE="true",
    )
    assert result.stdout.strip() == "('HTTP_X_FORWARDED_PROTO', 'https') True 600 True True"
    off = _django_setup(code)
    assert off.stdout.strip() == "None False 0 False False"  # plain http for the first run
    bad = _django_setup(SECURE_PROXY_SSL_HEADER="https")
    assert bad.returncode != 0
    assert "SECURE_PROXY_SSL_HEADER='https' is not a header and value" in _last_line(bad)
