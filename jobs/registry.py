"""The handler registry: which function runs a job of a given kind.

Handlers live in `<app>.handlers` modules of installed apps (found with Django's
`autodiscover_modules`, the way the admin finds `admin.py`) plus any module named in
`JOBS_EXTRA_HANDLER_MODULES`. Discovery runs lazily on the first lookup, so every process
that runs jobs — `run_jobs --burst`, a qcluster worker, a test — knows every kind, and
processes that only enqueue never import handler code they do not need.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import math
import threading
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules

from jobs.conf import get_config
from jobs.exceptions import UnknownJobKind
from jobs.kind_rates import Rate, parse_rate

logger = logging.getLogger(__name__)

HandlerFn = Callable[..., Any]  # fn(payload) or fn(payload, context); may be `async def`

_handlers: dict[str, HandlerFn] = {}
_outside_transaction: set[str] = set()  # kinds whose handler manages its own transactions
_idempotent: set[str] = set()  # kinds whose handler may run twice with no harm (issue 29)
_caps: dict[str, int] = {}  # kind -> most jobs of it processing at once, deployment-wide
_rates: dict[str, Rate] = {}  # kind -> most jobs of it started per second/minute/hour, ditto
_reserved: dict[str, int] = {}  # kind -> slots per process only it may use (issue 37.3)
_async: set[str] = set()  # kinds whose handler is an `async def` (the event loop runs them)
_with_context: set[str] = set()  # kinds whose handler takes the job context as well
_timeouts: dict[str, float] = {}  # kind -> seconds its handler may run (issue 37, point 6)
# A drain's statements after its last job starts, and django-q2's own margin: what a task
# needs besides JOBS_DRAIN_SECONDS, the timeout and the grace to end inside Q_TIMEOUT.
Q_TIMEOUT_MARGIN_SECONDS = 5.0
_discovered = False
_lock = threading.Lock()


def handler(
    kind: str,
    *,
    atomic: bool = True,
    idempotent: bool = False,
    concurrency: int | None = None,
    rate: str | None = None,
    reserved: int = 0,
    timeout: float | None = None,
) -> Callable[[HandlerFn], HandlerFn]:
    """Register the decorated `fn(payload: dict)` as the handler of `kind` jobs.

    With `atomic=False` the runner calls the handler outside any transaction and completes
    the job in its own one afterwards. That is for a handler with an effect outside the
    database (a Slack post) that must follow claim -> commit -> effect -> record: inside the
    job's transaction a database error after the effect would roll the claim back and the
    retry would repeat the effect. Such a handler must be idempotent per attempt.

    `idempotent=True` says that running the handler twice for one job is harmless (a no-op,
    a cache refresh, a write keyed so that a second one changes nothing). Only such kinds
    may have their completion sent with the next batch's statement and committed without
    the WAL flush (issue 29): a worker or database crash can then re-run a few of them.
    Every other kind's completion is committed durably before the next job starts, so a
    crash re-runs at most the job that was running (invariant I21).

    `concurrency=N` caps the jobs of this kind `processing` at once across every process and
    host at N (issue 37, point 2: a provider that allows 5 parallel calls, a rate-limited
    Slack channel). The database enforces it in the claim; the workers write the caps of
    their registry to `jobs_kindcap` at start-up (jobs/kind_caps.py). A job held back by
    its cap stays queued and spends no attempt.

    `rate="20/s"` (or per minute, "90/m", or per hour, "3/h") starts at most that many jobs
    of this kind per second across every process and host (issue 38, point 3: a provider's
    rate limit). The claim takes a token of the kind's bucket row for each job it takes
    (jobs/kind_rates.py, the send-rate bucket's SQL); a job held back by its rate stays
    queued, spends no attempt and holds no slot.
    `reserved=N` keeps N slots of each worker process for this kind alone (issue 37, point
    3): a backfill of another kind that fills every other slot does not keep it waiting.
    Its jobs use their own slots first, then the shared ones; the claim (in the database)
    takes no more of any kind than its own free slots and the shared free ones can start
    (jobs/ledger.py, migration 0024). Reservations must leave a shared slot for the other
    kinds (checked when a drain starts, `check_reservations`); with JOBS_CONCURRENCY=1 (the
    one-slot drain) they do not apply.
    An `async def` handler runs as a task on the worker process's event loop (issue 37);
    `atomic` does not apply to it (Django's transactions are synchronous): its completion is
    recorded as an `atomic=False` handler's is. A handler that takes a second positional
    argument gets the job's context (`jobs.handler_run.JobContext`: id, kind, attempt, its
    start, whether it was asked to stop); decided here, once, from its signature.

    `timeout=seconds` (JOBS_DEFAULT_TIMEOUT_SECONDS when left out): past it the handler is
    asked to stop (an `async def` one's task is cancelled; a thread one sees
    `job.stop_requested` set) and the job is retried or failed with "timed out after N s"
    once the handler has returned; one that has not returned JOBS_STOP_GRACE_SECONDS later
    retires its process (issue 37, point 6; jobs/stopping.py). A timeout that cannot fit
    inside django-q2's Q_TIMEOUT is refused here and at start-up (`check_timeouts`).

    Registering the same function twice (a module imported again) is allowed; registering a
    different function for a kind that already has one is a configuration error, because
    which of the two would run would depend on import order.
    """
    if not isinstance(kind, str) or not kind or len(kind) > 100:
        raise ImproperlyConfigured(f"job kind must be a non-empty string of <= 100 chars: {kind!r}")
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        raise ImproperlyConfigured(
            f"job kind {kind!r}: concurrency={concurrency!r} must be a whole number >= 1 "
            "(the most jobs of the kind running at once), or left out for no cap"
        )
    try:
        parsed_rate = None if rate is None else parse_rate(rate, kind=kind)
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from None

    if isinstance(reserved, bool) or not isinstance(reserved, int) or reserved < 0:
        raise ImproperlyConfigured(
            f"job kind {kind!r}: reserved={reserved!r} must be a whole number >= 0 (slots per "
            "worker process only this kind may use)"
        )
    if timeout is not None:
        _check_timeout(kind, timeout)

    def register(fn: HandlerFn) -> HandlerFn:
        existing = _handlers.get(kind)
        if existing is not None and _qualname(existing) != _qualname(fn):
            raise ImproperlyConfigured(
                f"job kind {kind!r} already has a handler {_qualname(existing)}; "
                f"refusing to register {_qualname(fn)}"
            )
        _handlers[kind] = fn
        if atomic:
            _outside_transaction.discard(kind)
        else:
            _outside_transaction.add(kind)
        if idempotent:
            _idempotent.add(kind)
        else:
            _idempotent.discard(kind)
        if concurrency is None:
            _caps.pop(kind, None)
        else:
            _caps[kind] = concurrency
        if parsed_rate is None:
            _rates.pop(kind, None)
        else:
            _rates[kind] = parsed_rate
        if reserved:
            _reserved[kind] = reserved
        else:
            _reserved.pop(kind, None)
        if timeout is None:
            _timeouts.pop(kind, None)
        else:
            _timeouts[kind] = float(timeout)
        _mark(_async, kind, inspect.iscoroutinefunction(fn))
        _mark(_with_context, kind, _takes_context(fn))
        return fn

    return register


def get_handler(kind: str) -> HandlerFn:
    """The handler of `kind`; raises UnknownJobKind (a permanent failure) if there is none."""
    discover()
    try:
        return _handlers[kind]
    except KeyError:
        raise UnknownJobKind(
            f"no handler registered for job kind {kind!r} (known: {', '.join(sorted(_handlers))})"
        ) from None


def runs_in_transaction(kind: str) -> bool:
    """Whether the runner wraps `kind`'s handler and the job's completion in one transaction."""
    return kind not in _outside_transaction


def is_idempotent(kind: str) -> bool:
    """Whether `kind`'s handler was declared safe to run twice (`idempotent=True`): only
    then may its completion wait for the next batch statement and skip the WAL flush."""
    return kind in _idempotent


def kind_caps() -> dict[str, int]:
    """Every registered kind that has a cap (`concurrency=`), with its cap."""
    discover()
    return dict(sorted(_caps.items()))


def kind_rates() -> dict[str, Rate]:
    """Every registered kind that has a rate (`rate=`), with its rate."""
    discover()
    return dict(sorted(_rates.items()))


def reserved_slots() -> dict[str, int]:
    """Every registered kind that keeps slots for itself (`reserved=`), with how many."""
    discover()
    return dict(sorted(_reserved.items()))


def async_kinds() -> list[str]:
    """The registered kinds whose handler is an `async def`."""
    discover()
    return sorted(_async)


def check_reservations_at_start() -> None:
    """A worker command's start-up check (`qcluster`, `run_jobs`): the reservations of this
    release's handlers fit the configured slots (else ImproperlyConfigured, naming them)."""
    config = get_config()
    check_reservations(threads=config.concurrency, async_tasks=config.async_concurrency)


def check_reservations(*, threads: int, async_tasks: int) -> None:
    """Refuse reservations that leave no shared slot (naming the kinds): every other kind
    would wait forever. The one-slot drain (threads == 1) ignores them."""
    if threads <= 1:
        return
    for pool, capacity, setting in (
        ("thread", threads, "JOBS_CONCURRENCY"),
        ("async", async_tasks, "JOBS_ASYNC_CONCURRENCY"),
    ):
        kinds = {k: n for k, n in reserved_slots().items() if (k in _async) == (pool == "async")}
        if sum(kinds.values()) >= capacity:
            listed = ", ".join(f"{kind} {n}" for kind, n in kinds.items())
            raise ImproperlyConfigured(
                f"job kinds reserve {sum(kinds.values())} {pool} slots per process ({listed}) "
                f"but {setting}={capacity}: leave at least one shared slot for the other kinds"
            )


def is_async(kind: str) -> bool:
    """Whether `kind`'s handler is an `async def` (run on the event loop, never in a thread)."""
    return kind in _async


def takes_context(kind: str) -> bool:
    """Whether `kind`'s handler is called as `fn(payload, context)`."""
    return kind in _with_context


def timeout_of(kind: str) -> float:
    """Seconds `kind`'s handler may run before it is asked to stop."""
    seconds = _timeouts.get(kind)
    return get_config().default_timeout_seconds if seconds is None else seconds


def check_timeouts() -> None:
    """Refuse (ImproperlyConfigured, naming each kind) every registered timeout, and the
    default, that cannot end inside django-q2's Q_TIMEOUT: a drain may start a job just
    before JOBS_DRAIN_SECONDS, which may run its timeout and JOBS_STOP_GRACE_SECONDS more.
    Past Q_TIMEOUT django-q2 kills the worker unnoticed by the runner; the reaper would only
    see a lease run out. Called by run_jobs and qcluster at start-up (a handler's own
    timeout is checked at its registration too)."""
    discover()
    config = get_config()
    if config.q_timeout is None:
        return
    room = config.q_timeout - config.drain_seconds - config.stop_grace_seconds
    room -= Q_TIMEOUT_MARGIN_SECONDS
    if config.default_timeout_seconds > room:
        defaults = [kind for kind in sorted(_handlers) if kind not in _timeouts]
        raise ImproperlyConfigured(
            f"JOBS_DEFAULT_TIMEOUT_SECONDS={config.default_timeout_seconds:g} (kinds "
            f"{', '.join(defaults) or 'none yet'}) cannot fit inside Q_TIMEOUT="
            f"{config.q_timeout:g}: {_room_words(room)}"
        )
    too_long = {kind: seconds for kind, seconds in sorted(_timeouts.items()) if seconds > room}
    if too_long:
        named = ", ".join(f"{kind} (timeout={seconds:g})" for kind, seconds in too_long.items())
        raise ImproperlyConfigured(
            f"job kind {named}: the timeout cannot fit inside Q_TIMEOUT={config.q_timeout:g}: "
            f"{_room_words(room)}"
        )


def _room_words(room: float) -> str:
    return (
        f"a drain may start a job at JOBS_DRAIN_SECONDS, and the job may run its timeout and "
        f"JOBS_STOP_GRACE_SECONDS more (+{Q_TIMEOUT_MARGIN_SECONDS:g} s), so at most "
        f"{max(room, 0):g} s fits; lower the timeout or raise Q_TIMEOUT"
    )


def _check_timeout(kind: str, timeout: object) -> None:
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise ImproperlyConfigured(
            f"job kind {kind!r}: timeout={timeout!r} must be a number of seconds > 0"
        )
    config = get_config()
    if config.q_timeout is not None:
        room = config.q_timeout - config.drain_seconds - config.stop_grace_seconds
        room -= Q_TIMEOUT_MARGIN_SECONDS
        if timeout > room:
            raise ImproperlyConfigured(
                f"job kind {kind!r} (timeout={timeout:g}): the timeout cannot fit inside "
                f"Q_TIMEOUT={config.q_timeout:g}: {_room_words(room)}"
            )


def registered_kinds() -> list[str]:
    discover()
    return sorted(_handlers)


def discover() -> None:
    """Import every `<app>.handlers` module and JOBS_EXTRA_HANDLER_MODULES, once per process."""
    global _discovered
    if _discovered:
        return
    with _lock:
        if _discovered:
            return
        autodiscover_modules("handlers")
        for module in get_config().extra_handler_modules:
            importlib.import_module(module)
        _discovered = True
        logger.debug(
            "job handlers discovered: %s",
            ", ".join(sorted(_handlers)),
            extra={"action": "job_handlers_discovered"},
        )


def _mark(kinds: set[str], kind: str, on: bool) -> None:
    if on:
        kinds.add(kind)
    else:
        kinds.discard(kind)


def _takes_context(fn: Callable[..., Any]) -> bool:
    """A second positional parameter (or `*args`) means the handler wants the context."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or C callable: called with the payload only
        return False
    positional = 0
    for parameter in parameters:
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            return True
        if parameter.kind in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            positional += 1
    return positional >= 2


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
