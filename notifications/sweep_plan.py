"""The planning half of a sweep cycle: what each user needs, and the user's writes.

`plan_user` decides from the batch's preloaded rows (no query) which sent rows are overdue
and what mail is due for the user's rung. `apply_user` runs inside the user's savepoint
(I11): it writes `expired` (review requests count on the ladder, I13) and **claims** the
mail, new rows inserted as `sending` and pending retries flipped to `sending`, both with
claimed_at. The claims commit with the batch; only then does sweep_delivery.py send (I12).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F

from notifications import sending, services
from notifications.addresses import address_problem
from notifications.emails import Delivery
from notifications.models import EmailNotification, NotificationPreference, Proposal
from project.db_clock import db_now

Kind = EmailNotification.Kind
Status = EmailNotification.Status
Rung = NotificationPreference.Rung

_DIGEST_DAYS = {Rung.DAILY: 1, Rung.WEEKLY: 7}
# Review requests to a user on a digest rung are throttled to the same cadence.
_REVIEW_DAYS = {Rung.IMMEDIATE: 0, **_DIGEST_DAYS}


@dataclass
class UserWork:
    """What one user needs this cycle, decided from the batch's preloaded rows (no query)."""

    expire_ids: list[int] = field(default_factory=list)
    claim_rows: list[EmailNotification] = field(default_factory=list)
    new_proposals: list[Proposal | None] = field(default_factory=list)  # None: a digest

    def __bool__(self) -> bool:
        return bool(self.expire_ids or self.claim_rows or self.new_proposals)


class Clock:
    """The database's time (its claims and expiries are compared by other hosts, whose clocks
    may be minutes off), or a fixed start (tests, benchmarks); it advances with the monotonic
    clock."""

    def __init__(self, start: datetime | None) -> None:
        self._start = start or db_now()
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


def _plan_sends(kind: str, user: Any, rung: str, now: datetime, work: UserWork) -> None:
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


def plan_user(kind: str, user: Any, now: datetime) -> UserWork:
    work = UserWork(expire_ids=_plan_expiry(user, now))
    _plan_sends(kind, user, _rung(user), now, work)
    return work


@dataclass
class UserResult:
    deliveries: list[Delivery] = field(default_factory=list)
    expired: int = 0
    stepped_down: bool = False
    invalid_address: int = 0
    held: int = 0  # new rows recorded `pending` because sending is paused
    suppressed: int = 0  # rows recorded `suppressed`: the address is on the suppression list


def apply_user(
    kind: str, user: Any, work: UserWork, clock: Clock, *, hold_until: datetime | None = None
) -> UserResult:
    """The user's writes; runs inside the user's savepoint (counted only once it commits).

    With `hold_until` (sending paused for the daily quota, notifications/pacing.py) nothing is
    claimed: due pending rows stay pending and new ones are recorded `pending`, due then.
    """
    now = clock.now()
    result = UserResult()
    if work.expire_ids:
        if kind == Kind.PROPOSAL_REVIEW:  # each expiry is a miss on the ladder
            expiry = services.review_requests_expire(
                user_id=user.pk, notification_ids=work.expire_ids, now=now
            )
            expired = result.expired = expiry.expired
            result.stepped_down = expiry.stepped_down
            if expiry.stepped_down and expiry.rung:  # the new rung decides what is sent now
                work = UserWork(expire_ids=work.expire_ids)
                _plan_sends(kind, user, expiry.rung, now, work)
        else:
            expired = result.expired = services.notifications_expire(
                notification_ids=work.expire_ids, now=now
            )
        if expired < len(work.expire_ids):
            # Another worker (or a reply) got to some of these rows first: ask nothing new
            # on stale information; the next cycle reads fresh rows.
            work.new_proposals = []
    problem = address_problem(user.email) if work.claim_rows or work.new_proposals else None
    if problem is not None:  # never claimed `sending`: fails at once, names the reason
        result.invalid_address = sending.notifications_fail_invalid_address(
            user_id=user.pk,
            kind=kind,
            pending_ids=[row.pk for row in work.claim_rows],
            proposal_ids=[p.pk if p else None for p in work.new_proposals],
            problem=problem,
            now=now,
        )
        return result
    if getattr(user, "is_suppressed", False):
        result.suppressed = _record_suppressed(kind, user, work, now)
        return result
    if hold_until is not None:
        if work.new_proposals:
            EmailNotification.objects.bulk_create(
                [
                    EmailNotification(
                        user_id=user.pk,
                        kind=kind,
                        proposal=proposal,
                        to_address=user.email,
                        status=Status.PENDING,
                        retry_after=hold_until,
                        last_error="waiting for the daily quota (sending paused)",
                    )
                    for proposal in work.new_proposals
                ]
            )
        result.held = len(work.new_proposals) + len(work.claim_rows)
        return result
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


def _record_suppressed(kind: str, user: Any, work: UserWork, now: datetime) -> int:
    """The user's address is suppressed: what would be claimed now ends `suppressed`, never
    sent (a new-proposal notice or review request is not asked again; the sweep's history
    sees the row). Returns how many rows."""
    note = "the address is suppressed (bounced or complained): not sent"
    updated = EmailNotification.objects.filter(
        pk__in=[row.pk for row in work.claim_rows], status=Status.PENDING
    ).update(status=Status.SUPPRESSED, retry_after=None, last_error=note, updated_at=now)
    created = EmailNotification.objects.bulk_create(
        [
            EmailNotification(
                user_id=user.pk,
                kind=kind,
                proposal=proposal,
                to_address=user.email,
                status=Status.SUPPRESSED,
                last_error=note,
            )
            for proposal in work.new_proposals
        ]
    )
    return updated + len(created)
