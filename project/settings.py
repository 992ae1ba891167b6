"""Settings of the worker, read from the environment (12-factor).

Every value has a default that needs no other service: the embedded PostgreSQL under
var/pg (started by scripts/run-worker), a local mail folder, Django's console email backend
and Slack off. Production sets
DATABASE_URL (PostgreSQL), INBOUND_EMAIL_STORE=s3://..., EMAIL_SENDER=ses and
SLACK_BOT_TOKEN. Each app owns one section below; keep settings of an app there.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from project import db_pool, embedded_pg, secret_key
from project.env import (
    env_bool,
    env_db,
    env_float,
    env_int,
    env_list,
    env_proxy_ssl_header,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("WORKER_VAR_DIR", str(BASE_DIR / "var")))

# An optional .env file next to manage.py (docker compose uses the same file).
if (BASE_DIR / ".env").is_file():
    environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

# --- core ---------------------------------------------------------------------------------------
DEBUG = env_bool("DEBUG", False)
# A key of real strength, whatever DEBUG says: django-q2 unpickles what is signed with it.
# Unset on the embedded default: the random key scripts/run-worker wrote under VAR_DIR
# (project/secret_key.py says why and how).
SECRET_KEY = secret_key.configured_key(
    env_value=env_str("SECRET_KEY", ""),
    var_dir=VAR_DIR,
    embedded=not env_str("DATABASE_URL", ""),
)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
# HTTPS (issue 19.3). Off by default so the first run answers on plain http://localhost; a
# deployment behind TLS sets them (.env.example does) and `manage.py check --deploy` is clean.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)  # seconds; 0 = no HSTS
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", False)
# "Header-Name:value" the TLS-terminating proxy sets on https requests (and strips from
# clients), e.g. X-Forwarded-Proto:https; empty = trust no header.
SECURE_PROXY_SSL_HEADER = env_proxy_ssl_header("SECURE_PROXY_SSL_HEADER")

INSTALLED_APPS = [
    "ops",  # before django_q: its qcluster command wraps django-q2's to create schedules first
    "project.apps.WorkerAdminConfig",  # django.contrib.admin with project.admin_site's site
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
    "processes",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # The admin's CSS/JS under gunicorn with DEBUG off (issue 19.4): nothing else serves them.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # A view that cannot reach the database answers a 503 page saying so (issue 36.8).
    "ops.database_down.DatabaseDownMiddleware",
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
# PostgreSQL only. Without DATABASE_URL: the embedded server (project/embedded_pg/) under
# VAR_DIR/pg, reached through its Unix socket; scripts/run-worker starts and stops it.
EMBEDDED_PG_DIR = VAR_DIR / "pg"
DATABASES = {"default": env_db("DATABASE_URL", embedded_pg.database_url(EMBEDDED_PG_DIR))}
DB_ENGINE = DATABASES["default"]["ENGINE"]
if DB_ENGINE != "django.db.backends.postgresql":
    raise ImproperlyConfigured(
        f"DATABASE_URL uses {DB_ENGINE}: the worker runs on PostgreSQL only "
        "(postgres://user:pass@host:5432/db; unset it for the embedded PostgreSQL)"
    )
DB_IS_EMBEDDED = Path(DATABASES["default"]["HOST"] or "-").resolve() == EMBEDDED_PG_DIR.resolve()
DATABASES["default"].setdefault("CONN_MAX_AGE", env_int("DB_CONN_MAX_AGE", 0, minimum=0))
DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)
# libpq TCP keepalives on every connection: a peer that vanished (NAT or load-balancer idle
# timeout, failover) is noticed instead of a socket that stays "open" for the process' life.
for _option, _value in {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}.items():
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault(_option, _value)
# Nothing relies on session state across transactions, so DATABASE_URL may point at PgBouncer
# in transaction pooling (issue 22): no server-side cursors (`.iterator()` would DECLARE one
# WITH HOLD and FETCH from it in later transactions, maybe on another server connection), and
# no prepared statements (Django's default for psycopg 3: prepare_threshold None; PgBouncer
# before 1.21 cannot keep them). Our code reads nothing big enough to need a server cursor.
DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
# The wake-up listener's own direct connection (behind PgBouncer in transaction pooling,
# LISTEN must not go through the pooler); empty: the default database's parameters.
LISTEN_DATABASE_URL = env_str("LISTEN_DATABASE_URL", "")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# Dates read ISO, UTC, with seconds on every page, the admin's lists and forms included
# (project/formats/en/formats.py; issue 31.6).
FORMAT_MODULE_PATH = ["project.formats"]
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"  # collectstatic writes here (the image does at build)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Compressed copies (gzip, brotli if installed) next to each file; no manifest, so a page
    # renders even where collectstatic never ran (tests, the first run).
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Until collectstatic has filled STATIC_ROOT (the image does it at build), serve straight
# from the apps' static folders, so the first run (runserver, DEBUG off by default) needs no
# collectstatic. Once collected, only STATIC_ROOT: with the finders on, WhiteNoise would
# serve the apps' uncompressed copies over the collected ones.
WHITENOISE_USE_FINDERS = not STATIC_ROOT.is_dir()
# A missing STATIC_ROOT (no collectstatic yet) is expected, not worth a warning.
warnings.filterwarnings("ignore", message="No directory at: ", category=UserWarning)

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
    # django-q2 logs each failed broker poll and schedule run with a traceback: through an
    # outage, one line per loop and a count per 30 s (project/quiet_log.py, I24).
    "filters": {"quiet_outage": {"()": "project.quiet_log.QuietFilter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["quiet_outage"],
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        # One INFO line per detector (17 per suspected bounce), under any sender's control
        # (issue 28.6): its warnings and errors only.
        "flufl.bounce": {"level": "WARNING"},
        # Django's pool (project/db_pool.py) warns at each failed background connect of an
        # outage; the queries that fail say so through our own loops' quiet logs (I24).
        "psycopg.pool": {"level": "ERROR"},
    },
}

# --- django-q2 ----------------------------------------------------------------------------------
# The Job table is the source of truth; a django-q2 task is only a wake-up, so its own retry
# (a visibility timeout) must exceed the task timeout and a duplicate wake-up is harmless.
Q_WORKERS = env_int("Q_WORKERS", 2, minimum=1)
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
    # Successful task results kept (django-q2 deletes the oldest past it; 0 would keep all).
    # Failures are never capped by django-q2: ops.tasks.prune_task_history deletes task
    # results of either kind older than Q_TASK_RETENTION_DAYS (issue 21).
    "save_limit": env_int("Q_SAVE_LIMIT", 250, minimum=1),
    "poll": env_float("Q_POLL", 0.2, minimum=0.05),  # seconds between ORM broker polls
    "label": "Django Q2",
    # Refuses, records and deletes every broker row naming a function outside the allowlist
    # in code (ops/task_guard.py), before a worker imports anything (issue 19).
    "broker_class": "ops.task_guard.GuardedOrmBroker",
    # Refuses, records and deletes every broker row naming a function outside the allowlist
    # in code (ops/task_guard.py), before a worker imports anything (issue 19).
    "sync": env_bool("Q_SYNC", False),
}

Q_TASK_RETENTION_DAYS = env_float("Q_TASK_RETENTION_DAYS", 30, minimum=0.001)

# --- shared: outgoing Reply-To (notifications) and token lookup (inbound email) ------------
INBOUND_REPLY_ADDRESS = env_str("INBOUND_REPLY_ADDRESS", "replies@reply.localhost")
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "Proposal Assistant <assistant@localhost>")

# --- canonical ids ------------------------------------------------------------------------------
# Ids "SSSSSSSSSS.uuuuuu" whose micro part is congruent to the writer slot mod the modulus.
# CANONICAL_IDS_ROLE: "worker" leases a slot from the pool; a fixed role (web, engine-aux,
# grantbot) leases its fixed slot; "none" holds no slot and cannot mint.
CANONICAL_IDS_ROLE = env_str("CANONICAL_IDS_ROLE", "worker").strip().lower()
WRITER_SLOT_MODULUS = 100
CANONICAL_IDS_FIXED_SLOTS = {
    "web": env_int("CANONICAL_IDS_SLOT_WEB", 1, minimum=0),
    "engine-aux": env_int("CANONICAL_IDS_SLOT_ENGINE_AUX", 2, minimum=0),
    "grantbot": env_int("CANONICAL_IDS_SLOT_GRANTBOT", 3, minimum=0),
}
# Worker pool: slots leased one per OS process (comma list; "a-b" is an inclusive range).
CANONICAL_IDS_WORKER_POOL = env_str("CANONICAL_IDS_WORKER_POOL", "4,10-99")
CANONICAL_IDS_LEASE_TTL = env_float("CANONICAL_IDS_LEASE_TTL", 60.0, minimum=1.0)  # seconds
CANONICAL_IDS_RENEW_INTERVAL = env_float(  # seconds; must be well below the TTL
    "CANONICAL_IDS_RENEW_INTERVAL", 20.0, minimum=0.1
)
# --- jobs ---------------------------------------------------------------------------------------
# A claimed row is leased; a live worker renews the lease every JOBS_HEARTBEAT_SECONDS and the
# reaper reclaims rows whose lease ran out (crashed worker). See docs/jobs.md.
# Every qcluster, django-q2 worker and service loop beats this often; silent for 3 beats = gone.
PROCESS_HEARTBEAT_SECONDS = env_float("PROCESS_HEARTBEAT_SECONDS", 10.0, minimum=0.05)  # seconds
JOBS_LEASE_SECONDS = env_float("JOBS_LEASE_SECONDS", 120, minimum=0.5)  # seconds
JOBS_HEARTBEAT_SECONDS = env_float(  # seconds; must be well under the lease
    "JOBS_HEARTBEAT_SECONDS", JOBS_LEASE_SECONDS / 4, minimum=0.05
)
# (jobs/conf.py checks that the heartbeat is below the lease, at start-up.)
JOBS_BACKOFF_BASE_SECONDS = env_float("JOBS_BACKOFF_BASE_SECONDS", 10, minimum=0)  # seconds
JOBS_BACKOFF_CAP_SECONDS = env_float("JOBS_BACKOFF_CAP_SECONDS", 3600, minimum=0)  # seconds
JOBS_BACKOFF_JITTER = env_float("JOBS_BACKOFF_JITTER", 0.25, minimum=0)  # fraction of the delay
JOBS_DEFAULT_MAX_ATTEMPTS = env_int("JOBS_DEFAULT_MAX_ATTEMPTS", 5, minimum=1)
JOBS_LISTENER_PING_SECONDS = env_float("JOBS_LISTENER_PING_SECONDS", 15.0, minimum=0.1)
JOBS_CLAIM_BATCH_SIZE = env_int("JOBS_CLAIM_BATCH_SIZE", 20, minimum=1)  # rows per claim query
# Issue 36, point 2: after a claim of less than half a batch, the runner sends its next claim
# no sooner than this after it, so a steady trickle is taken in batches, not a job a claim.
JOBS_CLAIM_GATHER_SECONDS = env_float("JOBS_CLAIM_GATHER_SECONDS", 0.01, minimum=0)  # seconds
# The runner starts a batch's jobs one after another; when one runs longer than this, the
# ones it has not started go back to the queue for an idle worker (issue 22, points 4 and 5).
JOBS_HOLD_UNSTARTED_SECONDS = env_float("JOBS_HOLD_UNSTARTED_SECONDS", 0.05, minimum=0.001)
# ...and at most this many stored payload bytes per claim (always at least one job).
JOBS_CLAIM_MAX_BYTES = env_int("JOBS_CLAIM_MAX_BYTES", 4 * 1024 * 1024, minimum=1)
JOBS_RETENTION_DAYS = env_float("JOBS_RETENTION_DAYS", 14, minimum=0)  # completed rows kept
# Failed and cancelled rows are evidence an operator may still read: kept longer (issue 38).
JOBS_FAILED_RETENTION_DAYS = env_float("JOBS_FAILED_RETENTION_DAYS", 30, minimum=0)
JOBS_CANCELLED_RETENTION_DAYS = env_float("JOBS_CANCELLED_RETENTION_DAYS", 30, minimum=0)
# Issue 38, point 2: a job may snooze (jobs.Snooze, no attempt spent) this many times; the next
# snooze fails it. 0: a snooze fails the job at once.
JOBS_MAX_SNOOZES = env_int("JOBS_MAX_SNOOZES", 100, minimum=0)
JOBS_EXTRA_HANDLER_MODULES = env_list("JOBS_EXTRA_HANDLER_MODULES", [])  # besides <app>.handlers
JOBS_DRAIN_SECONDS = env_float(  # seconds one scheduled/woken drain may claim new batches
    "JOBS_DRAIN_SECONDS", min(60.0, Q_TIMEOUT / 2), minimum=1
)
# Issue 29: completions of kinds declared idempotent wait for the next batch statement and
# commit without the WAL flush; off: every completion is flushed before the next job starts.
JOBS_BATCH_IDEMPOTENT_COMPLETIONS = env_bool("JOBS_BATCH_IDEMPOTENT_COMPLETIONS", True)
# Issue 29, point 5: a qcluster drain that runs out of jobs waits this long for the next one,
# asking every JOBS_LINGER_POLL_SECONDS (one read of the claim index): enqueue->start within
# that poll instead of a trip through django-q2's broker (Q_POLL). 0: return at once.
JOBS_LINGER_SECONDS = env_float("JOBS_LINGER_SECONDS", 2.0, minimum=0)  # seconds
JOBS_LINGER_POLL_SECONDS = env_float("JOBS_LINGER_POLL_SECONDS", 0.05, minimum=0.01)  # seconds
# Next to a long transaction a claim starts its due scan at a per-process floor on run_after
# and scans in full every JOBS_CLAIM_FULL_SCAN_SECONDS (0: always in full; while the full scan
# is slow, every twenty times its duration up to 30 s, jobs/claim_floor.py); the
# floor stays JOBS_CLAIM_FLOOR_MARGIN_SECONDS below the first due row a scan saw (issue 32).
JOBS_CLAIM_FULL_SCAN_SECONDS = env_float("JOBS_CLAIM_FULL_SCAN_SECONDS", 1.0, minimum=0)  # s
JOBS_CLAIM_FLOOR_MARGIN_SECONDS = env_float("JOBS_CLAIM_FLOOR_MARGIN_SECONDS", 1.0, minimum=0)  # s
JOBS_POLL_SECONDS = env_float("JOBS_POLL_SECONDS", 1.0, minimum=0.05)  # run_jobs idle sleep
# Issue 37, point 1: jobs one worker process runs at once. Ordinary handlers run in a pool of
# this many threads (1: today's one-at-a-time drain on the calling thread); `async def`
# handlers as tasks on one event loop of the process, up to JOBS_ASYNC_CONCURRENCY at once.
JOBS_CONCURRENCY = env_int("JOBS_CONCURRENCY", 10, minimum=1)  # thread slots per process
# The connection budget (issue 37, docs/operations.md "Connection budget"): at most this many
# thread slots per process hold a transaction of the runner's (an `atomic` handler that has
# sent a statement) at once; the others wait for a unit before their first statement,
# holding no server connection. Behind PgBouncer the pool must exceed the deployment's
# processes x this, so the drains, keepers and beacons never wait behind them.
JOBS_ATOMIC_CONCURRENCY = env_int("JOBS_ATOMIC_CONCURRENCY", 1, minimum=1)
JOBS_ASYNC_CONCURRENCY = env_int("JOBS_ASYNC_CONCURRENCY", 500, minimum=1)  # async tasks
# Issue 37, points 6 and 9: a handler past its timeout (`@handler(kind, timeout=)`, else
# JOBS_DEFAULT_TIMEOUT_SECONDS) is asked to stop (an async one cancelled); one that has not
# returned JOBS_STOP_GRACE_SECONDS later retires its process, which is replaced. On SIGTERM the
# running slots get JOBS_SHUTDOWN_GRACE_SECONDS to finish before they are asked to stop. A
# drain may start a job at its end (JOBS_DRAIN_SECONDS): drain + timeout + grace must fit in
# Q_TIMEOUT, checked at start-up per kind (jobs/registry.py: check_timeouts).
JOBS_STOP_GRACE_SECONDS = env_float("JOBS_STOP_GRACE_SECONDS", 10.0, minimum=0.1)  # seconds
JOBS_SHUTDOWN_GRACE_SECONDS = env_float("JOBS_SHUTDOWN_GRACE_SECONDS", 5.0, minimum=0)  # s
JOBS_DEFAULT_TIMEOUT_SECONDS = env_float(  # seconds; the default fits the default Q_TIMEOUT
    "JOBS_DEFAULT_TIMEOUT_SECONDS",
    max(1.0, min(180.0, Q_TIMEOUT - JOBS_DRAIN_SECONDS - JOBS_STOP_GRACE_SECONDS - 5)),
    minimum=0.1,
)
# --- database pool (the default database's; sized from the jobs' threads) ---------------------
# Django's connection pool (psycopg_pool, project/db_pool.py): a thread checks a connection
# out at its first query and gives it back at close, so a worker process opens at most
# DB_POOL_MAX_SIZE (default JOBS_CONCURRENCY + 4: its slots, its drain and keeper, two spare)
# however many threads it runs. DB_POOL=0: one connection per thread, as before.
# Not with DB_CONN_MAX_AGE > 0 (persistent connections): then no pool, or an error if DB_POOL=1.
DB_POOL_OPTIONS = db_pool.pool_options(
    jobs_concurrency=JOBS_CONCURRENCY, conn_max_age=DATABASES["default"]["CONN_MAX_AGE"]
)
if DB_POOL_OPTIONS is not None:
    DATABASES["default"]["OPTIONS"]["pool"] = DB_POOL_OPTIONS
# --- inbound email ------------------------------------------------------------------------------
# Where SES drops inbound mail: "s3://bucket/prefix" (AWS credentials, region and
# AWS_ENDPOINT_URL come from boto3's standard environment) or a local folder (the default).
INBOUND_EMAIL_STORE = env_str("INBOUND_EMAIL_STORE", str(VAR_DIR / "inbound_mail"))
# Handled-but-poisoned objects are moved here (S3: a key prefix in the same bucket; a folder
# store: a sub-folder). Never listed as intake.
INBOUND_EMAIL_QUARANTINE_PREFIX = env_str("INBOUND_EMAIL_QUARANTINE_PREFIX", "quarantine/")
# Attachments of accepted replies are stored here (S3: a key prefix in the same bucket; a
# folder store: a sub-folder). Never listed as intake. Larger ones (bytes, decoded), and those
# past the count, are kept only in the mail's raw source, which is then kept too.
INBOUND_EMAIL_ATTACHMENTS_PREFIX = env_str("INBOUND_EMAIL_ATTACHMENTS_PREFIX", "attachments/")
INBOUND_EMAIL_MAX_ATTACHMENT_BYTES = env_int(
    "INBOUND_EMAIL_MAX_ATTACHMENT_BYTES", 8 * 1024 * 1024, minimum=1024
)
INBOUND_EMAIL_MAX_ATTACHMENTS = env_int("INBOUND_EMAIL_MAX_ATTACHMENTS", 20, minimum=1)
INBOUND_EMAIL_MAX_PER_RUN = env_int("INBOUND_EMAIL_MAX_PER_RUN", 2000, minimum=1)  # objects
# Seconds an S3 call may wait to connect, and for each read, per try (S3_MAX_ATTEMPTS tries):
# a hung S3 must fail the call well inside the poll task's timeout, not after botocore's
# default 60 s x 5 tries.
INBOUND_EMAIL_S3_TIMEOUT = env_float("INBOUND_EMAIL_S3_TIMEOUT", 20, minimum=1)
# Seconds one mail's GetObject may take in all, its body included (issue 21): the timeout
# above bounds each read, not a body that trickles in; past this the read is abandoned and
# the mail retried after the backoff.
INBOUND_EMAIL_S3_READ_DEADLINE = env_float("INBOUND_EMAIL_S3_READ_DEADLINE", 60, minimum=1)
INBOUND_EMAIL_MAX_BYTES = env_int("INBOUND_EMAIL_MAX_BYTES", 10 * 1024 * 1024, minimum=1024)
INBOUND_EMAIL_MAX_ATTEMPTS = env_int("INBOUND_EMAIL_MAX_ATTEMPTS", 5, minimum=1)  # then quarantine
INBOUND_EMAIL_RETRY_BASE_SECONDS = env_float("INBOUND_EMAIL_RETRY_BASE_SECONDS", 30, minimum=0)
INBOUND_EMAIL_RETRY_CAP_SECONDS = env_float("INBOUND_EMAIL_RETRY_CAP_SECONDS", 3600, minimum=0)
INBOUND_EMAIL_POLL_INTERVAL = env_float("INBOUND_EMAIL_POLL_INTERVAL", 30, minimum=1)  # seconds
# Parsing limits (issue 10): a mail past one is quarantined at once, the limit named as the
# reason. Checked while the parser builds the message, before anything is decoded.
INBOUND_EMAIL_MAX_MIME_PARTS = env_int("INBOUND_EMAIL_MAX_MIME_PARTS", 100, minimum=1)  # parts
INBOUND_EMAIL_MAX_MIME_DEPTH = env_int("INBOUND_EMAIL_MAX_MIME_DEPTH", 20, minimum=1)  # levels
INBOUND_EMAIL_MAX_HEADERS = env_int("INBOUND_EMAIL_MAX_HEADERS", 1000, minimum=10)  # fields
INBOUND_EMAIL_MAX_HEADER_BYTES = env_int(  # one header field, raw
    "INBOUND_EMAIL_MAX_HEADER_BYTES", 16 * 1024, minimum=256
)
INBOUND_EMAIL_MAX_HEADER_TOTAL_BYTES = env_int(  # all header fields together, raw
    "INBOUND_EMAIL_MAX_HEADER_TOTAL_BYTES", 256 * 1024, minimum=1024
)
INBOUND_EMAIL_MAX_TEXT_BYTES = env_int(  # the text part used, after transfer decoding
    "INBOUND_EMAIL_MAX_TEXT_BYTES", 1024 * 1024, minimum=1024
)
# A mail that looks like a bounce or complaint report (issue 28.6) is read as one from its
# header block and at most this many bytes of its body, under the limits above: the bounce
# detectors (flufl.bounce's heuristics cost ~10 us a line) never see more, whatever the
# mail's size. A real report names the failure at the top, well within it.
INBOUND_EMAIL_MAX_REPORT_BYTES = env_int("INBOUND_EMAIL_MAX_REPORT_BYTES", 32 * 1024, minimum=1024)
# Of those, what flufl.bounce's heuristic detectors (bounces that are not RFC 3464, e.g.
# Exim's text) scan: ~50 regular-expression passes over every line, so less.
INBOUND_EMAIL_MAX_BOUNCE_SCAN_BYTES = env_int(
    "INBOUND_EMAIL_MAX_BOUNCE_SCAN_BYTES", 8 * 1024, minimum=1024
)
# Block elements nested at once in the HTML part (issue 21): an HTML parser costs the depth
# for each nested <div>; deeper mail is quarantined html_depth_limit, unparsed.
INBOUND_EMAIL_MAX_HTML_DEPTH = env_int("INBOUND_EMAIL_MAX_HTML_DEPTH", 1000, minimum=10)
# SES verdicts (issue 10): reject a reply that failed DMARC (or, without a DMARC verdict, SPF
# and DKIM), quarantine a mail with a virus. Unset: on for an s3:// store, off for a folder.
INBOUND_EMAIL_CHECK_SES_VERDICTS = (
    env_bool("INBOUND_EMAIL_CHECK_SES_VERDICTS", False)
    if env_str("INBOUND_EMAIL_CHECK_SES_VERDICTS", "").strip()
    else None
)
# The receiving host's authserv-id (issue 21): with the verdict check on, a dmarc=fail in the
# topmost Authentication-Results naming this host rejects the reply. Empty: not read.
INBOUND_EMAIL_AUTHSERV_ID = env_str("INBOUND_EMAIL_AUTHSERV_ID", "amazonses.com")
MAX_REPLIES_PER_TOKEN_PER_HOUR = env_int("MAX_REPLIES_PER_TOKEN_PER_HOUR", 5, minimum=1)
# Retention (issue 21): a rejected mail keeps its headers and the first bytes of its raw
# source (at most 64 KiB), the rest dropped at once; finished rows older than the retention
# (days; as Rails' Action Mailbox incinerates) are pruned hourly, quarantined mail never.
INBOUND_EMAIL_REJECTED_RAW_BYTES = env_int("INBOUND_EMAIL_REJECTED_RAW_BYTES", 64 * 1024, minimum=0)
INBOUND_RETENTION_DAYS = env_float("INBOUND_RETENTION_DAYS", 30, minimum=0.001)
# Instruction relay (outbox): attempts to post to Slack before the instruction falls back to
# the database inbox and is flagged for an operator; backoff between attempts (seconds).
INBOUND_RELAY_MAX_ATTEMPTS = env_int("INBOUND_RELAY_MAX_ATTEMPTS", 6, minimum=1)
INBOUND_RELAY_BACKOFF_BASE_SECONDS = env_float("INBOUND_RELAY_BACKOFF_BASE_SECONDS", 30, minimum=0)
INBOUND_RELAY_BACKOFF_CAP_SECONDS = env_float("INBOUND_RELAY_BACKOFF_CAP_SECONDS", 1800, minimum=0)
# A relay claimed (`posting`) this long ago lost its worker between the post and the record:
# it is taken over and looked up in Slack first. Must exceed one attempt's Slack calls (a
# post plus a bounded history search, each up to SLACK_TIMEOUT) (seconds).
INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS = env_float(
    "INBOUND_RELAY_CLAIM_TIMEOUT_SECONDS", 300, minimum=60
)
# Slack: empty token = Slack off (instructions go to the database inbox).
SLACK_BOT_TOKEN = env_str("SLACK_BOT_TOKEN", "")
SLACK_API_URL = env_str("SLACK_API_URL", "https://slack.com/api/")
# Seconds per HTTP call. At least 10: a post answered after the timeout still arrives, and a
# 1 s timeout turned a slow Slack into repeated lookups and retries.
SLACK_TIMEOUT = env_float("SLACK_TIMEOUT", 10, minimum=10)
# --- notifications ------------------------------------------------------------------------------
# How notification mail leaves: "django" (Django's EMAIL_BACKEND; console on the embedded
# default), "ses" (boto3 SES send_raw_email; credentials, AWS_REGION/AWS_DEFAULT_REGION and
# AWS_ENDPOINT_URL come from boto3's standard environment; SES_REGION overrides the region),
# or the dotted path of a sender class. notifications/conf.py resolves and checks it at
# start-up (an unknown value stops start-up naming EMAIL_SENDER).
EMAIL_SENDER = env_str("EMAIL_SENDER", "django").strip()
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
# For EMAIL_BACKEND=django.core.mail.backends.smtp.EmailBackend. EMAIL_TIMEOUT bounds every
# SMTP call (Django's own default is no timeout: a server that never answers held the sweep
# and its advisory lock until the task was killed) (seconds).
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = env_float("EMAIL_TIMEOUT", 20, minimum=1)
SES_REGION = env_str("SES_REGION", "")  # empty: boto3's own region chain
SES_CONFIGURATION_SET = env_str("SES_CONFIGURATION_SET", "")  # empty: none
# A review request must be answered within this many hours, or it expires and counts as missed.
NOTIFICATION_REVIEW_EXPIRY_HOURS = env_int("NOTIFICATION_REVIEW_EXPIRY_HOURS", 72, minimum=1)
# New-proposal notices and digests accept replies (instructions) for this many hours.
NOTIFICATION_REPLY_WINDOW_HOURS = env_int("NOTIFICATION_REPLY_WINDOW_HOURS", 168, minimum=1)
# Send attempts per row (a claim is an attempt) before it is marked failed.
NOTIFICATION_SEND_MAX_ATTEMPTS = env_int("NOTIFICATION_SEND_MAX_ATTEMPTS", 5, minimum=1)
NOTIFICATION_RETRY_BASE_SECONDS = env_int("NOTIFICATION_RETRY_BASE_SECONDS", 60, minimum=0)
NOTIFICATION_RETRY_MAX_SECONDS = env_int("NOTIFICATION_RETRY_MAX_SECONDS", 3600, minimum=0)
# A row left `sending` longer than this (seconds) is a crashed claim and goes back to pending.
NOTIFICATION_CLAIM_TIMEOUT_SECONDS = env_int("NOTIFICATION_CLAIM_TIMEOUT_SECONDS", 900, minimum=60)
NOTIFICATION_SWEEP_BATCH_SIZE = env_int("NOTIFICATION_SWEEP_BATCH_SIZE", 500, minimum=1)  # users
# One cycle of a sweep at a time: its lease (seconds, database clock), renewed every quarter of
# it while the cycle runs; a worker that died holding it lets the next cycle run after this.
NOTIFICATION_SWEEP_LEASE_SECONDS = env_float("NOTIFICATION_SWEEP_LEASE_SECONDS", 30, minimum=1)
# Pacing (notifications/pacing.py): mails per second for all worker processes together; 0 = the
# account's MaxSendRate from SES GetSendQuota (re-read every ..._QUOTA_REFRESH_SECONDS).
NOTIFICATION_SEND_RATE = env_float("NOTIFICATION_SEND_RATE", 0, minimum=0)
NOTIFICATION_SEND_QUOTA_REFRESH_SECONDS = env_int(
    "NOTIFICATION_SEND_QUOTA_REFRESH_SECONDS", 600, minimum=10
)
# After SES's "Daily message quota exceeded" all sending pauses this long, then asks SES again.
NOTIFICATION_SEND_PAUSE_SECONDS = env_int("NOTIFICATION_SEND_PAUSE_SECONDS", 900, minimum=10)
# A send refused for the rate ("Maximum sending rate exceeded") waits this long, then tries again.
NOTIFICATION_THROTTLE_RETRY_SECONDS = env_float("NOTIFICATION_THROTTLE_RETRY_SECONDS", 1, minimum=0)
# SES events through SNS (/ses/events, notifications/ses_events.py): the topic ARNs believed;
# empty = the endpoint answers 404.
SES_EVENTS_TOPIC_ARNS = env_list("SES_EVENTS_TOPIC_ARNS", [])
# Never from the environment: signing-certificate URLs accepted besides SNS's own hosts (the
# tests' local certificate). In production only sns.<region>.amazonaws.com signs.
SES_EVENTS_TRUSTED_CERT_URLS: list[str] = []
SES_EVENTS_TRUSTED_SUBSCRIBE_URLS: list[str] = []  # the same, for SubscribeURL
# Bounds of /ses/events (issue 28): a bigger body is refused unread (SNS messages are at most
# 256 KiB); a certificate or SubscribeURL fetch may take this long in all; a certificate URL
# that failed answers 503 from the cache this long; at most this many fetches of certificate
# URLs not in the cache per minute and process.
SES_EVENTS_MAX_BODY_BYTES = env_int("SES_EVENTS_MAX_BODY_BYTES", 1024 * 1024, minimum=1024)
SES_EVENTS_FETCH_DEADLINE_SECONDS = env_float("SES_EVENTS_FETCH_DEADLINE_SECONDS", 5, minimum=0.1)
SES_EVENTS_CERT_FAILURE_CACHE_SECONDS = env_float(
    "SES_EVENTS_CERT_FAILURE_CACHE_SECONDS", 60, minimum=0
)
SES_EVENTS_CERT_FETCHES_PER_MINUTE = env_int("SES_EVENTS_CERT_FETCHES_PER_MINUTE", 10, minimum=1)
# The https:// base URL this worker's web service is reached at: notifications then carry a
# one-click List-Unsubscribe link (RFC 8058) to <PUBLIC_BASE_URL>/unsubscribe/<token>.
# Empty: mailto only (`check --deploy` warns).
PUBLIC_BASE_URL = env_str("PUBLIC_BASE_URL", "")
# --- ops ----------------------------------------------------------------------------------------
# Bearer token a Prometheus scrape must send to /metrics; empty = the endpoint answers 404.
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
# A transaction open longer than this (seconds) is listed as needing an operator (issue 32).
OPS_LONG_TRANSACTION_ALERT_SECONDS = env_float("OPS_LONG_TRANSACTION_ALERT_SECONDS", 300, minimum=1)
# The qcluster rolls up the counters' append-only deltas this often (ops/rollup_ticker.py):
# every reader sums the deltas not rolled up yet, so fewer of them keep the console fast.
OPS_ROLLUP_SECONDS = env_float("OPS_ROLLUP_SECONDS", 5, minimum=0.1)
