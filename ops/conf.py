"""The settings the ops app reads, in one place (validated, each error naming the variable).

ops is the glue of the other apps (schedules, status, the demo): what it shows of another
app's configuration it reads through that app's conf where one exists (EMAIL_SENDER through
notifications.conf, INBOUND_EMAIL_STORE through inbound_email.conf).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

CONSOLE_EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"


@dataclass(frozen=True)
class Config:
    base_dir: Path  # BASE_DIR: the folder of manage.py (the demo's next steps cd there)
    var_dir: Path  # WORKER_VAR_DIR: where the demo writes its mail
    email_backend: str  # Django's EMAIL_BACKEND (the demo swaps console for files)
    cluster_workers: int  # Q_CLUSTER["workers"]: django-q2 worker processes per cluster
    db_is_embedded: bool  # DB_IS_EMBEDDED: DATABASE_URL unset, the embedded PostgreSQL
    metrics_token: str  # METRICS_TOKEN: bearer token of /metrics; empty: the endpoint is off
    task_retention_days: float  # Q_TASK_RETENTION_DAYS: django-q2 task results kept (days)
    # OPS_LONG_TRANSACTION_ALERT_SECONDS: a transaction open longer needs an operator (s)
    long_transaction_alert_seconds: float
    # OPS_ROLLUP_SECONDS: the qcluster rolls up the counter deltas this often (s)
    rollup_seconds: float


def _str(name: str, default: str) -> str:
    value = getattr(settings, name, default)
    if not isinstance(value, str) or not value:
        raise ImproperlyConfigured(f"{name}={value!r} must be a non-empty string")
    return value


def _workers(cluster: Any) -> int:
    workers = cluster.get("workers") if isinstance(cluster, dict) else None
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ImproperlyConfigured(
            f"Q_CLUSTER['workers']={workers!r} (from Q_WORKERS) must be >= 1"
        )
    return workers


def _token(value: Any) -> str:
    if not isinstance(value, str):
        raise ImproperlyConfigured(f"METRICS_TOKEN={type(value).__name__} must be a string")
    return value


def _seconds(name: str, default: float) -> float:
    value = getattr(settings, name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ImproperlyConfigured(f"{name}={value!r} must be a number of seconds above 0")
    return float(value)


def _days(name: str, default: float) -> float:
    value = getattr(settings, name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ImproperlyConfigured(f"{name}={value!r} must be a number of days above 0")
    return float(value)


@cache  # cleared whenever a setting changes (override_settings, pytest's settings fixture)
def get_config() -> Config:
    var_dir = getattr(settings, "VAR_DIR", None)
    if not isinstance(var_dir, str | Path) or not str(var_dir):
        raise ImproperlyConfigured(f"VAR_DIR={var_dir!r} (from WORKER_VAR_DIR) must be a path")
    base_dir = getattr(settings, "BASE_DIR", None)
    if not isinstance(base_dir, str | Path) or not str(base_dir):
        raise ImproperlyConfigured(f"BASE_DIR={base_dir!r} must be a path")
    return Config(
        base_dir=Path(base_dir),
        var_dir=Path(var_dir),
        email_backend=_str("EMAIL_BACKEND", CONSOLE_EMAIL_BACKEND),
        cluster_workers=_workers(getattr(settings, "Q_CLUSTER", {})),
        db_is_embedded=bool(getattr(settings, "DB_IS_EMBEDDED", False)),
        metrics_token=_token(getattr(settings, "METRICS_TOKEN", "")),
        task_retention_days=_days("Q_TASK_RETENTION_DAYS", 30),
        long_transaction_alert_seconds=_seconds("OPS_LONG_TRANSACTION_ALERT_SECONDS", 300),
        rollup_seconds=_seconds("OPS_ROLLUP_SECONDS", 5),
    )


@receiver(setting_changed)
def _forget_config(**kwargs: Any) -> None:
    get_config.cache_clear()
