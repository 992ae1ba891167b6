"""Settings of the worker, read from the environment (12-factor).

Every value has a default that runs with no server: an embedded SQLite file, a
local mail folder, Django's console email backend and Slack off. Production sets
DATABASE_URL (PostgreSQL), INBOUND_EMAIL_STORE=s3://..., EMAIL_SENDER=ses and
SLACK_BOT_TOKEN. Each app owns one section below; keep settings of an app there.
"""

from __future__ import annotations

from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from project.env import env_bool, env_db, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("WORKER_VAR_DIR", str(BASE_DIR / "var")))

# An optional .env file next to manage.py (docker compose uses the same file).
if (BASE_DIR / ".env").is_file():
    environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

# --- core ---------------------------------------------------------------------------------------
DEBUG = env_bool("DEBUG", True)
INSECURE_DEV_SECRET_KEY = "django-insecure-dev-only-never-use-in-production"
SECRET_KEY = env_str("SECRET_KEY", INSECURE_DEV_SECRET_KEY)
if not DEBUG and SECRET_KEY == INSECURE_DEV_SECRET_KEY:
    raise ImproperlyConfigured(
        "SECRET_KEY is the insecure development default while DEBUG is off: set SECRET_KEY "
        "to a long random value (python -c 'import secrets; print(secrets.token_urlsafe(50))')."
    )
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "ops",  # before django_q: its qcluster command wraps django-q2's to create schedules first
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_q",
    "canonical_ids",
    "jobs",
    "inbound_email",
    "notifications",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database -----------------------------------------------------------------------------------
DEFAULT_SQLITE_PATH = VAR_DIR / "worker.sqlite3"
DATABASES = {"default": env_db("DATABASE_URL", f"sqlite:///{DEFAULT_SQLITE_PATH}")}
DB_ENGINE = DATABASES["default"]["ENGINE"]
IS_SQLITE = DB_ENGINE == "django.db.backends.sqlite3"
if IS_SQLITE:
    Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    # One writer at a time: WAL lets readers run beside it, IMMEDIATE takes the write lock at
    # BEGIN (no upgrade deadlocks), and the timeout makes a second writer wait, not fail.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
else:
    DATABASES["default"].setdefault("CONN_MAX_AGE", env_int("DB_CONN_MAX_AGE", 0, minimum=0))
    DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

# --- logging ------------------------------------------------------------------------------------
LOG_LEVEL = env_str("LOG_LEVEL", "INFO").upper()
LOG_FORMAT = env_str("LOG_FORMAT", "text").lower()
if LOG_FORMAT not in {"text", "json"}:
    raise ImproperlyConfigured(f"LOG_FORMAT={LOG_FORMAT!r}: use 'text' or 'json'")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"},
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s",
        },
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"django.db.backends": {"level": "INFO"}},
}

# --- django-q2 ----------------------------------------------------------------------------------
# The Job table is the source of truth; a django-q2 task is only a wake-up, so its own retry
# (a visibility timeout) must exceed the task timeout and a duplicate wake-up is harmless.
Q_WORKERS = env_int("Q_WORKERS", 1 if IS_SQLITE else 2, minimum=1)
Q_TIMEOUT = env_int("Q_TIMEOUT", 300, minimum=1)  # seconds a task may run
Q_CLUSTER = {
    "name": "worker",
    "orm": "default",
    "workers": Q_WORKERS,
    "timeout": Q_TIMEOUT,
    "retry": Q_TIMEOUT + 60,  # seconds; must exceed timeout
    "max_attempts": 1,
    "ack_failures": True,
    "catch_up": False,
    "save_limit": env_int("Q_SAVE_LIMIT", 250, minimum=0),
    "poll": env_float("Q_POLL", 0.2, minimum=0.05),  # seconds between ORM broker polls
    "label": "Django Q2",
    "sync": env_bool("Q_SYNC", False),
}

# --- shared: outgoing Reply-To (notifications) and token lookup (inbound email) ------------
INBOUND_REPLY_ADDRESS = env_str("INBOUND_REPLY_ADDRESS", "replies@reply.localhost")
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "Proposal Assistant <assistant@localhost>")

# --- canonical ids ------------------------------------------------------------------------------
# --- jobs ---------------------------------------------------------------------------------------
# --- inbound email ------------------------------------------------------------------------------
# --- notifications ------------------------------------------------------------------------------
