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
Planning and claiming is in sweep_plan.py, delivery in sweep_delivery.py; this module runs
the cycle (lease, reconcile, batches, summary).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from notifications import selectors, sending, sweep_lease
from notifications.conf import get_config
from notifications.emails import Delivery
from notifications.models import EmailNotification
from notifications.pacing import Pacer
from notifications.senders import get_sender
from notifications.senders.base import EmailSender
from notifications.sweep_delivery import deliver_batch
from notifications.sweep_plan import Clock, apply_user, plan_user
from project.reconnect import connection_lost

logger = logging.getLogger(__name__)

Kind = EmailNotification.Kind
Status = EmailNotification.Status

SWEEPS: tuple[str, ...] = (Kind.NEW_PROPOSAL, Kind.PROPOSAL_REVIEW, Kind.DIGEST)


@dataclass
class SweepSummary:
    sweep: str
    users: int = 0  # candidate users visited
    sent: int = 0  # mails accepted by the mail service
    failed: int = 0  # sends refused this cycle (retried later, or failed for good)
    invalid_address: int = 0  # rows failed at the claim: the user's address cannot be used
    expired: int = 0  # unanswered rows written `expired`
    skipped: int = 0  # users with nothing due (paused, no address, not due, nothing new)
    errors: int = 0  # users (or rows) whose processing raised; rolled back and logged
    reconciled: int = 0  # stale `sending` claims handed back
    stepped_down: int = 0  # users moved one rung down the ladder
    released: int = 0  # claims handed back unused (out of claim time, or refused for the rate)
    throttled: int = 0  # sends refused for the rate and tried again (no attempt spent)
    held: int = 0  # mails waiting `pending` for a sending pause (daily quota) to end
    suppressed: int = 0  # rows recorded `suppressed` (address on the suppression list)
    busy: bool = False  # another worker was running this sweep: this cycle did nothing
    lease_lost: bool = False  # the lease expired and another worker took over mid-cycle
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@contextmanager
def _sweep_lease(kind: str) -> Iterator[tuple[datetime | None, Callable[[], bool]]]:
    """One cycle of a sweep at a time across all workers (notifications/sweep_lease.py).

    django-q2 enqueues a schedule again when its interval passes even if the last run is
    still going; two runs of one sweep would only collide on the unique constraints (and log
    an error per user), so the second simply yields. Yields the database's time when the
    lease was taken (None: another worker holds it), the sweep's clock (a host's may be
    minutes off, and claims and expiries are compared by every host), and whether the lease
    was lost meanwhile. Inside a transaction (a test's) the lease row is not visible to the
    keeper's connection until commit, so nothing renews it there.
    """
    seconds = get_config().sweep_lease_seconds
    holder = sweep_lease.new_holder()
    db_time = sweep_lease.sweep_lease_acquire(kind=kind, holder=holder, seconds=seconds)
    if db_time is None:
        yield None, lambda: False
        return
    keeper = None
    if not connection.in_atomic_block:
        keeper = sweep_lease.LeaseKeeper(kind=kind, holder=holder, seconds=seconds)
        keeper.start()
    try:
        yield db_time, (keeper.lost.is_set if keeper else lambda: False)
    finally:
        if keeper is not None:
            keeper.stop()
        sweep_lease.sweep_lease_release(kind=kind, holder=holder)


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
    sender = sender or get_sender()
    batch_size = batch_size or get_config().sweep_batch_size
    summary = SweepSummary(sweep=kind)
    with _sweep_lease(kind) as (db_time, lease_lost):
        if db_time is None:
            summary.busy = True
            logger.info(
                "%s sweep: another worker is running it; skipping this cycle",
                kind,
                extra={"action": "notification_sweep_busy", "sweep": kind},
            )
            return summary
        return _run_locked(kind, Clock(now or db_time), sender, batch_size, summary, lease_lost)


def _run_locked(
    kind: str,
    clock: Clock,
    sender: EmailSender,
    batch_size: int,
    summary: SweepSummary,
    lease_lost: Callable[[], bool],
) -> SweepSummary:
    started = time.monotonic()
    pacer = Pacer(sender)
    summary.reconciled = sending.notification_reconcile_stale_claims(kind=kind, now=clock.now())
    after_id = 0
    while True:
        deliveries: list[Delivery] = []
        claimed_since = time.monotonic()
        # While sending is paused (daily quota), due mail is recorded `pending`, not claimed.
        hold_until = pacer.hold_until(clock.now())
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
                    work = plan_user(kind, user, batch_now)
                    if not work:
                        summary.skipped += 1
                        continue
                    with transaction.atomic():  # this user's savepoint (I11)
                        result = apply_user(kind, user, work, clock, hold_until=hold_until)
                except Exception as exc:  # noqa: BLE001 - one user's failure must not stop the sweep: rolled back to the savepoint, logged, the batch carries on
                    if connection_lost(exc):
                        # Not this user's failure: the batch's transaction (every claim in
                        # it) died with the session. End the cycle (the lease is released on
                        # a fresh connection); nothing planned in this batch may be delivered.
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
                summary.invalid_address += result.invalid_address
                summary.held += result.held
                summary.suppressed += result.suppressed
                if not result.deliveries:
                    summary.skipped += 1
                deliveries.extend(result.deliveries)
        # The claims are committed: only now may mail leave (I12).
        deliver_batch(deliveries, sender, clock, summary, claimed_since=claimed_since, pacer=pacer)
        if len(users) < batch_size:
            break
        if lease_lost():  # another worker runs this sweep now: it takes the rest
            summary.lease_lost = True
            break
    summary.seconds = round(time.monotonic() - started, 3)
    logger.info(
        "%s sweep: %s users, %s sent, %s failed, %s expired, %s skipped, %s errors, %s held",
        kind,
        summary.users,
        summary.sent,
        summary.failed,
        summary.expired,
        summary.skipped,
        summary.errors,
        summary.held,
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
