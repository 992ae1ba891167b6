"""The three notification sweeps: new_proposal, proposal_review, digest.

Each sweep walks its candidate users in batches. Per batch:

1. Plan, in one transaction: every user runs in its **own savepoint** (I11). Overdue `sent`
   rows are written `expired` (I13; for review requests each one counts as missed and may
   step the user down the ladder), then the mail due for the user is **claimed**: new rows are
   inserted as `sending`, pending retries are flipped to `sending`, both with claimed_at. An
   exception for one user rolls back to that user's savepoint, is logged with the user and the
   sweep, and the batch carries on and commits.
2. Deliver, after that commit (I12): each claimed row is handed to the sender; accepted ->
   `sent` with the message id; refused -> back to `pending` with a backoff (or `failed` when
   its attempts are spent). A crash anywhere here leaves rows `sending`; the next sweep's
   reconciler hands them back to pending after NOTIFICATION_CLAIM_TIMEOUT_SECONDS.

Call a sweep outside any transaction (the claims must commit before the mail leaves).
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import F
from django.utils import timezone

from notifications import selectors, services
from notifications.emails import Delivery, render_notification_email
from notifications.exceptions import SendError
from notifications.mail import EmailSender, get_sender
from notifications.models import EmailNotification, NotificationPreference, Proposal
from project.reconnect import connection_lost, discard_broken_connection

logger = logging.getLogger(__name__)

Kind = EmailNotification.Kind
Status = EmailNotification.Status
Rung = NotificationPreference.Rung

SWEEPS: tuple[str, ...] = (Kind.NEW_PROPOSAL, Kind.PROPOSAL_REVIEW, Kind.DIGEST)
_DIGEST_DAYS = {Rung.DAILY: 1, Rung.WEEKLY: 7}
# Review requests to a user on a digest rung are throttled to the same cadence.
_REVIEW_DAYS = {Rung.IMMEDIATE: 0, **_DIGEST_DAYS}


@dataclass
class SweepSummary:
    sweep: str
    users: int = 0  # candidate users visited
    sent: int = 0  # mails accepted by the mail service
    failed: int = 0  # sends refused this cycle (retried later, or failed for good)
    expired: int = 0  # unanswered rows written `expired`
    skipped: int = 0  # users with nothing due (paused, no address, not due, nothing new)
    errors: int = 0  # users (or rows) whose processing raised; rolled back and logged
    reconciled: int = 0  # stale `sending` claims handed back
    stepped_down: int = 0  # users moved one rung down the ladder
    released: int = 0  # claims handed back unused (delivery ran out of claim time)
    busy: bool = False  # another worker was running this sweep: this cycle did nothing
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _UserWork:
    """What one user needs this cycle, decided from the batch's preloaded rows (no query)."""

    expire_ids: list[int] = field(default_factory=list)
    claim_rows: list[EmailNotification] = field(default_factory=list)
    new_proposals: list[Proposal | None] = field(default_factory=list)  # None: a digest

    def __bool__(self) -> bool:
        return bool(self.expire_ids or self.claim_rows or self.new_proposals)


class _Clock:
    """Real time, or a fixed start (tests, benchmarks) that advances with the monotonic clock."""

    def __init__(self, start: datetime | None) -> None:
        self._start = start or timezone.now()
        self._t0 = time.monotonic()

    def now(self) -> datetime:
        return self._start + timedelta(seconds=time.monotonic() - self._t0)


def _rung(user: Any) -> str:
    try:
        return user.notification_preference.rung
    except NotificationPreference.DoesNotExist:
        return Rung.IMMEDIATE


def _is_due(days: int, last_sent_at: datetime | None, now: datetime) -> bool:
    """Calendar days (UTC) since the last mail of the kind: no drift with the sweep's cadence."""
    return last_sent_at is None or (now.date() - last_sent_at.date()).days >= days


def _can_mail(user: Any) -> bool:
    return bool(user.is_active and user.email)


def _plan_expiry(user: Any, now: datetime) -> list[int]:
    return [
        row.pk
        for row in user.kind_rows
        if row.status == Status.SENT and row.expires_at is not None and row.expires_at <= now
    ]


def _plan_sends(kind: str, user: Any, rung: str, now: datetime, work: _UserWork) -> None:
    """Fill work.claim_rows / work.new_proposals for the user's current rung."""
    if rung == Rung.PAUSED or not _can_mail(user):
        return
    work.claim_rows = [
        row
        for row in user.kind_rows
        if row.status == Status.PENDING and (row.retry_after is None or row.retry_after <= now)
    ]
    # A review request that expires now may be asked again; a new-proposal notice never is.
    reaskable = set(work.expire_ids) if kind == Kind.PROPOSAL_REVIEW else set()
    has_row = {row.proposal_id for row in user.kind_rows if row.pk not in reaskable}
    if kind == Kind.NEW_PROPOSAL:
        # Immediate-rung PIs hear of each proposal entering review once; the others read it
        # in their digest.
        if rung == Rung.IMMEDIATE:
            work.new_proposals = [p for p in user.proposals_in_review if p.pk not in has_row]
    elif kind == Kind.PROPOSAL_REVIEW:
        unasked = [p for p in user.proposals_in_review if p.pk not in has_row]
        if rung == Rung.IMMEDIATE:
            work.new_proposals = unasked
        elif unasked and _is_due(_REVIEW_DAYS[rung], user.last_sent_at, now):
            work.new_proposals = unasked[:1]
    elif rung in _DIGEST_DAYS and user.proposals_in_review:
        unsent = any(row.status in (Status.PENDING, Status.SENDING) for row in user.kind_rows)
        if not unsent and _is_due(_DIGEST_DAYS[rung], user.last_sent_at, now):
            work.new_proposals = [None]


def _plan(kind: str, user: Any, now: datetime) -> _UserWork:
    work = _UserWork(expire_ids=_plan_expiry(user, now))
    _plan_sends(kind, user, _rung(user), now, work)
    return work


@dataclass
class _UserResult:
    deliveries: list[Delivery] = field(default_factory=list)
    expired: int = 0
    stepped_down: bool = False


def _apply(kind: str, user: Any, work: _UserWork, clock: _Clock) -> _UserResult:
    """The user's writes; runs inside the user's savepoint (counted only once it commits)."""
    now = clock.now()
    result = _UserResult()
    if work.expire_ids:
        if kind == Kind.PROPOSAL_REVIEW:  # each expiry is a miss on the ladder
            expiry = services.review_requests_expire(
                user_id=user.pk, notification_ids=work.expire_ids, now=now
            )
            expired = result.expired = expiry.expired
            result.stepped_down = expiry.stepped_down
            if expiry.stepped_down and expiry.rung:  # the new rung decides what is sent now
                work = _UserWork(expire_ids=work.expire_ids)
                _plan_sends(kind, user, expiry.rung, now, work)
        else:
            expired = result.expired = services.notifications_expire(
                notification_ids=work.expire_ids, now=now
            )
        if expired < len(work.expire_ids):
            # Another worker (or a reply) got to some of these rows first: ask nothing new
            # on stale information; the next cycle reads fresh rows.
            work.new_proposals = []
    deliveries = result.deliveries
    claimed_at = now
    base = {
        "kind": kind,
        "to_address": user.email,
        "user_id": user.pk,
        "recipient_name": user.get_full_name() or user.get_username(),
        "claimed_at": claimed_at,
    }
    digest_titles = tuple(p.title for p in user.proposals_in_review) if kind == Kind.DIGEST else ()
    titles = {p.pk: p.title for p in user.proposals_in_review}
    if work.claim_rows:
        claimable = list(
            EmailNotification.objects.select_for_update(skip_locked=True)
            .filter(pk__in=[row.pk for row in work.claim_rows], status=Status.PENDING)
            .values_list("pk", "attempts")
        )
        if claimable:
            EmailNotification.objects.filter(pk__in=[pk for pk, _ in claimable]).update(
                status=Status.SENDING,
                claimed_at=claimed_at,
                attempts=F("attempts") + 1,
                to_address=user.email,
                updated_at=now,
            )
        rows = {row.pk: row for row in work.claim_rows}
        for pk, attempts in claimable:
            deliveries.append(
                Delivery(
                    notification_id=pk,
                    token=rows[pk].token,
                    attempt=attempts + 1,
                    proposal_title=titles.get(rows[pk].proposal_id, ""),
                    digest_titles=digest_titles,
                    **base,
                )
            )
    if work.new_proposals:
        created = EmailNotification.objects.bulk_create(
            [
                EmailNotification(
                    user_id=user.pk,
                    kind=kind,
                    proposal=proposal,
                    to_address=user.email,
                    status=Status.SENDING,
                    claimed_at=claimed_at,
                    attempts=1,
                )
                for proposal in work.new_proposals
            ]
        )
        for row, proposal in zip(created, work.new_proposals, strict=True):
            deliveries.append(
                Delivery(
                    notification_id=row.pk,
                    token=row.token,
                    attempt=1,
                    proposal_title=proposal.title if proposal else "",
                    digest_titles=digest_titles,
                    **base,
                )
            )
    return result


def _expiry_window(kind: str) -> timedelta:
    if kind == Kind.PROPOSAL_REVIEW:
        return timedelta(hours=settings.NOTIFICATION_REVIEW_EXPIRY_HOURS)
    return timedelta(hours=settings.NOTIFICATION_REPLY_WINDOW_HOURS)


def _deliver(delivery: Delivery, sender: EmailSender, clock: _Clock, summary: SweepSummary) -> None:
    expires_at = clock.now() + _expiry_window(delivery.kind)
    email = render_notification_email(delivery, expires_at=expires_at)
    try:
        message_id = sender.send(email)
    except SendError as exc:
        status = services.notification_record_send_failure(
            notification_id=delivery.notification_id,
            claimed_at=delivery.claimed_at,
            attempt=delivery.attempt,
            error=str(exc),
            now=clock.now(),
        )
        summary.failed += 1
        logger.warning(
            "%s sweep: send of notification %s to user %s refused (attempt %s, now %s): %s",
            delivery.kind,
            delivery.notification_id,
            delivery.user_id,
            delivery.attempt,
            status,
            exc,
            extra={
                "action": "notification_send_failed",
                "sweep": delivery.kind,
                "user_id": delivery.user_id,
                "notification_id": delivery.notification_id,
                "attempt": delivery.attempt,
            },
        )
        return
    record = {
        "notification_id": delivery.notification_id,
        "message_id": message_id,
        "sent_at": clock.now(),
        "expires_at": expires_at,
    }
    try:
        services.notification_mark_sent(**record)
    except DatabaseError as exc:
        if not connection_lost(exc):
            raise
        # The mail has left: record it on a fresh connection rather than leave the row
        # `sending` for the reconciler, which would mail it again.
        discard_broken_connection()
        services.notification_mark_sent(**record)
    summary.sent += 1


def _deliver_batch(
    deliveries: list[Delivery],
    sender: EmailSender,
    clock: _Clock,
    summary: SweepSummary,
    *,
    claimed_since: float,
) -> None:
    """Send the batch's claimed rows; `claimed_since` is the monotonic time the claims began."""
    claim_budget = settings.NOTIFICATION_CLAIM_TIMEOUT_SECONDS / 2
    for index, delivery in enumerate(deliveries):
        if time.monotonic() - claimed_since > claim_budget:
            # Slow mail service: hand the rest back before the reconciler of another worker
            # takes them as crashed (which would risk duplicates).
            rest = deliveries[index:]
            summary.released += services.notification_release_claims(
                claims=[(d.notification_id, d.claimed_at) for d in rest], now=clock.now()
            )
            logger.warning(
                "%s sweep: delivery ran out of claim time, %s claims handed back",
                delivery.kind,
                len(rest),
                extra={"action": "notification_claims_released", "sweep": delivery.kind},
            )
            return
        try:
            _deliver(delivery, sender, clock, summary)
        except Exception as exc:  # noqa: BLE001 - one row's failure must not stop the others; the row stays `sending` and the reconciler returns it to pending
            if connection_lost(exc):
                # The database is gone: mail sent now could not be recorded and would go
                # out twice. Stop; the rest stay claimed, unsent, for the reconciler.
                raise
            summary.errors += 1
            logger.exception(
                "%s sweep: delivery of notification %s to user %s failed",
                delivery.kind,
                delivery.notification_id,
                delivery.user_id,
                extra={
                    "action": "notification_delivery_error",
                    "sweep": delivery.kind,
                    "user_id": delivery.user_id,
                    "notification_id": delivery.notification_id,
                },
            )


@contextmanager
def _sweep_lock(kind: str) -> Iterator[bool]:
    """One cycle of a sweep at a time across all workers (a PostgreSQL advisory lock).

    django-q2 enqueues a schedule again when its interval passes even if the last run is
    still going; two runs of one sweep would only collide on the unique constraints (and log
    an error per user), so the second simply yields. SQLite has one writer anyway.
    """
    if connection.vendor != "postgresql":
        yield True
        return
    key = zlib.crc32(f"notifications.sweep.{kind}".encode())
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s), pg_backend_pid()", [key])
        acquired, session = cursor.fetchone()
    try:
        yield acquired
    finally:
        if acquired:
            _sweep_unlock(kind, key, session)


def _sweep_unlock(kind: str, key: int, session: int) -> None:
    """Release the lock on the session that took it. If that session died (server restart,
    `pg_terminate_backend`), the lock died with it and Django may already have opened a new
    session, which does not hold it: nothing to release, and unlocking there would only
    warn. The sweep itself ended with the lost connection (see `_run_locked`)."""
    current = connection.connection
    if current is None or current.closed or current.info.backend_pid != session:
        logger.warning(
            "%s sweep: its database session ended; the advisory lock went with it",
            kind,
            extra={"action": "notification_sweep_lock_lost", "sweep": kind},
        )
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s)", [key])


def run_sweep(
    kind: str,
    *,
    now: datetime | None = None,
    sender: EmailSender | None = None,
    batch_size: int | None = None,
) -> SweepSummary:
    """Run one cycle of the sweep `kind`; return (and log) its summary."""
    if kind not in SWEEPS:
        raise ValueError(f"unknown sweep {kind!r}; choose from {', '.join(SWEEPS)}")
    kind = Kind(kind).value
    clock = _Clock(now)
    sender = sender or get_sender()
    batch_size = batch_size or settings.NOTIFICATION_SWEEP_BATCH_SIZE
    summary = SweepSummary(sweep=kind)
    with _sweep_lock(kind) as acquired:
        if not acquired:
            summary.busy = True
            logger.info(
                "%s sweep: another worker is running it; skipping this cycle",
                kind,
                extra={"action": "notification_sweep_busy", "sweep": kind},
            )
            return summary
        return _run_locked(kind, clock, sender, batch_size, summary)


def _run_locked(
    kind: str, clock: _Clock, sender: EmailSender, batch_size: int, summary: SweepSummary
) -> SweepSummary:
    started = time.monotonic()
    summary.reconciled = services.notification_reconcile_stale_claims(kind=kind, now=clock.now())
    after_id = 0
    while True:
        deliveries: list[Delivery] = []
        claimed_since = time.monotonic()
        with transaction.atomic():
            batch_now = clock.now()
            users = selectors.sweep_user_batch(
                kind=kind, now=batch_now, after_id=after_id, limit=batch_size
            )
            if not users:
                break
            after_id = users[-1].pk
            for user in users:
                summary.users += 1
                try:
                    work = _plan(kind, user, batch_now)
                    if not work:
                        summary.skipped += 1
                        continue
                    with transaction.atomic():  # this user's savepoint (I11)
                        result = _apply(kind, user, work, clock)
                except Exception as exc:  # noqa: BLE001 - one user's failure must not stop the sweep: rolled back to the savepoint, logged, the batch carries on
                    if connection_lost(exc):
                        # Not this user's failure: the batch's transaction (every claim in
                        # it) and the sweep's lock died with the session. End the cycle;
                        # nothing planned in this batch may be delivered.
                        raise
                    summary.errors += 1
                    logger.exception(
                        "%s sweep: user %s failed; rolled back, sweep continues",
                        kind,
                        user.pk,
                        extra={
                            "action": "notification_sweep_user_error",
                            "sweep": kind,
                            "user_id": user.pk,
                        },
                    )
                    continue
                summary.expired += result.expired
                summary.stepped_down += result.stepped_down
                if not result.deliveries:
                    summary.skipped += 1
                deliveries.extend(result.deliveries)
        # The claims are committed: only now may mail leave (I12).
        _deliver_batch(deliveries, sender, clock, summary, claimed_since=claimed_since)
        if len(users) < batch_size:
            break
    summary.seconds = round(time.monotonic() - started, 3)
    logger.info(
        "%s sweep: %s users, %s sent, %s failed, %s expired, %s skipped, %s errors",
        kind,
        summary.users,
        summary.sent,
        summary.failed,
        summary.expired,
        summary.skipped,
        summary.errors,
        extra={"action": "notification_sweep_done", **summary.as_dict()},
    )
    return summary


def _sweep(kind: str) -> Callable[..., SweepSummary]:
    def sweep(**kwargs: Any) -> SweepSummary:
        return run_sweep(kind, **kwargs)

    sweep.__name__ = f"sweep_{kind}"
    sweep.__doc__ = f"One cycle of the {kind} sweep (see the module docstring)."
    return sweep


sweep_new_proposals = _sweep(Kind.NEW_PROPOSAL)
sweep_proposal_reviews = _sweep(Kind.PROPOSAL_REVIEW)
sweep_digests = _sweep(Kind.DIGEST)
