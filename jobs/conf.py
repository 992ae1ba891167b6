"""The jobs app's settings, validated (each error naming the variable) and cached until a
setting changes (override_settings and pytest's settings fixture send setting_changed).
Every module of the app reads settings here.

project/settings.py parses the environment (with the minimums an operator may set); this
module checks what the job loop itself relies on (types, signs, the heartbeat below the
lease) and is called once by the AppConfig, so a bad value stops start-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver


@dataclass(frozen=True)
class Config:
    lease_seconds: float  # a claimed job's lease; the reaper reclaims it after this
    heartbeat_seconds: float  # a live worker renews its leases this often
    backoff_base_seconds: float
    backoff_cap_seconds: float
    backoff_jitter: float  # fraction of the delay added at random
    default_max_attempts: int
    claim_batch_size: int  # rows per claim statement
    claim_gather_seconds: float  # after a claim below half a batch, the next waits this long
    hold_unstarted_seconds: float  # a running job's longest wait before the rest go back
    claim_max_bytes: int  # stored payload bytes per claim statement (at least one row)
    batch_idempotent_completions: bool  # idempotent kinds' completions batched, unflushed
    retention_days: float  # completed rows older than this are pruned
    failed_retention_days: float  # failed rows older than this are pruned (issue 38)
    cancelled_retention_days: float  # cancelled rows older than this are pruned (issue 38)
    max_snoozes: int  # a job's snoozes (jobs.Snooze) before the next one fails it (issue 38)
    extra_handler_modules: tuple[str, ...]  # imported besides every <app>.handlers
    drain_seconds: float  # how long one woken/scheduled drain may claim new batches
    poll_seconds: float  # run_jobs' sleep when the queue is empty
    concurrency: int  # thread slots per process (1: the drain runs each job on its own thread)
    # thread slots per process inside a transaction of the runner's at once (the budget)
    atomic_concurrency: int
    async_concurrency: int  # `async def` handlers running at once on the process's event loop
    linger_seconds: float  # a qcluster drain waits this long for a job before it returns
    linger_poll_seconds: float  # and asks this often whether one is due
    claim_full_scan_seconds: float  # a claim scans the whole due set at least this often
    claim_floor_margin_seconds: float  # the floor stays this far below what a scan saw
    cluster_workers: int  # Q_CLUSTER["workers"]: bounds the wake tasks a drain may add
    listener_ping_seconds: float  # the wake-up listener pings this often, waits this long
    listen_database_url: str  # direct connection for LISTEN ("" = the default database's)
    default_timeout_seconds: float  # a handler's timeout unless `@handler(timeout=)` says
    stop_grace_seconds: float  # after being asked to stop, a handler's last chance to return
    shutdown_grace_seconds: float  # on SIGTERM, the running slots' time to finish
    q_timeout: float | None  # Q_CLUSTER["timeout"]: django-q2 kills a task running longer


def _number(name: str, default: float, *, positive: bool = False) -> float:
    value = getattr(settings, name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ImproperlyConfigured(f"{name}={value!r} must be a number")
    if value < 0 or (positive and value == 0):
        raise ImproperlyConfigured(f"{name}={value!r} must be {'> 0' if positive else '>= 0'}")
    return value


def _count(name: str, default: int) -> int:
    value = getattr(settings, name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ImproperlyConfigured(f"{name}={value!r} must be a whole number >= 1")
    return value


def _whole(name: str, default: int) -> int:
    value = getattr(settings, name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ImproperlyConfigured(f"{name}={value!r} must be a whole number >= 0")
    return value


def _flag(name: str, default: bool) -> bool:
    value = getattr(settings, name, default)
    if not isinstance(value, bool):
        raise ImproperlyConfigured(f"{name}={value!r} must be True or False")
    return value


def _modules(name: str) -> tuple[str, ...]:
    value: Any = getattr(settings, name, ())
    if isinstance(value, str) or not all(isinstance(m, str) and m for m in value):
        raise ImproperlyConfigured(f"{name}={value!r} must be a list of module paths")
    return tuple(value)


@cache  # cleared whenever a setting changes (override_settings, pytest's settings fixture)
def get_config() -> Config:
    lease = _number("JOBS_LEASE_SECONDS", 120, positive=True)
    heartbeat = _number("JOBS_HEARTBEAT_SECONDS", lease / 4, positive=True)
    if heartbeat >= lease:
        raise ImproperlyConfigured(
            f"JOBS_HEARTBEAT_SECONDS={heartbeat} must be below "
            f"JOBS_LEASE_SECONDS={lease} (a third or a quarter of it is usual)"
        )
    return Config(
        lease_seconds=lease,
        heartbeat_seconds=heartbeat,
        backoff_base_seconds=_number("JOBS_BACKOFF_BASE_SECONDS", 10),
        backoff_cap_seconds=_number("JOBS_BACKOFF_CAP_SECONDS", 3600),
        backoff_jitter=_number("JOBS_BACKOFF_JITTER", 0.25),
        default_max_attempts=_count("JOBS_DEFAULT_MAX_ATTEMPTS", 5),
        claim_batch_size=_count("JOBS_CLAIM_BATCH_SIZE", 20),
        claim_gather_seconds=_number("JOBS_CLAIM_GATHER_SECONDS", 0.01),
        hold_unstarted_seconds=_number("JOBS_HOLD_UNSTARTED_SECONDS", 0.05, positive=True),
        claim_max_bytes=_count("JOBS_CLAIM_MAX_BYTES", 4 * 1024 * 1024),
        batch_idempotent_completions=_flag("JOBS_BATCH_IDEMPOTENT_COMPLETIONS", True),
        retention_days=_number("JOBS_RETENTION_DAYS", 14),
        failed_retention_days=_number("JOBS_FAILED_RETENTION_DAYS", 30),
        cancelled_retention_days=_number("JOBS_CANCELLED_RETENTION_DAYS", 30),
        max_snoozes=_whole("JOBS_MAX_SNOOZES", 100),
        extra_handler_modules=_modules("JOBS_EXTRA_HANDLER_MODULES"),
        drain_seconds=_number("JOBS_DRAIN_SECONDS", 60, positive=True),
        poll_seconds=_number("JOBS_POLL_SECONDS", 1.0, positive=True),
        concurrency=_count("JOBS_CONCURRENCY", 10),
        atomic_concurrency=_count("JOBS_ATOMIC_CONCURRENCY", 1),
        async_concurrency=_count("JOBS_ASYNC_CONCURRENCY", 500),
        linger_seconds=_number("JOBS_LINGER_SECONDS", 2.0),
        linger_poll_seconds=_number("JOBS_LINGER_POLL_SECONDS", 0.05, positive=True),
        claim_full_scan_seconds=_number("JOBS_CLAIM_FULL_SCAN_SECONDS", 1.0),
        claim_floor_margin_seconds=_number("JOBS_CLAIM_FLOOR_MARGIN_SECONDS", 1.0),
        cluster_workers=_cluster_workers(),
        listener_ping_seconds=_number("JOBS_LISTENER_PING_SECONDS", 15, positive=True),
        listen_database_url=_url("LISTEN_DATABASE_URL"),
        default_timeout_seconds=_number("JOBS_DEFAULT_TIMEOUT_SECONDS", 180, positive=True),
        stop_grace_seconds=_number("JOBS_STOP_GRACE_SECONDS", 10, positive=True),
        shutdown_grace_seconds=_number("JOBS_SHUTDOWN_GRACE_SECONDS", 5),
        q_timeout=_q_timeout(),
    )


def _url(name: str) -> str:
    value = getattr(settings, name, "")
    if not isinstance(value, str):
        raise ImproperlyConfigured(f"{name}={value!r} must be a URL string")
    return value


def _q_timeout() -> float | None:
    cluster = getattr(settings, "Q_CLUSTER", {})
    timeout = cluster.get("timeout") if isinstance(cluster, dict) else None
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ImproperlyConfigured(f"Q_CLUSTER['timeout']={timeout!r} must be a number > 0")
    return float(timeout)


def _cluster_workers() -> int:
    cluster = getattr(settings, "Q_CLUSTER", {})
    workers = cluster.get("workers", 1) if isinstance(cluster, dict) else 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ImproperlyConfigured(f"Q_CLUSTER['workers']={workers!r} must be >= 1")
    return workers


@receiver(setting_changed)
def _forget_config(**kwargs: Any) -> None:
    get_config.cache_clear()
