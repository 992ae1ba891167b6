"""Reads of the sweeps: which users need work, loaded in batches with everything the sweep needs.

One batch costs a fixed number of queries (users + preference by join, their proposals in
review, their rows of the sweep's kind) whatever its size, so a sweep is O(users / batch)
queries for reading and never N+1.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Protocol

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, Exists, OuterRef, Prefetch, Q, QuerySet, Subquery
from django.db.models.functions import Lower

from notifications.conf import get_config
from notifications.models import (
    DeliveryFeedback,
    EmailNotification,
    NotificationPreference,
    Proposal,
    SendingState,
)
from notifications.suppression import active_suppressions

Kind = EmailNotification.Kind
Status = EmailNotification.Status
Rung = NotificationPreference.Rung

OPEN = [Status.PENDING, Status.SENDING, Status.SENT]


def _rows_of_kind(kind: str) -> QuerySet[EmailNotification]:
    """The rows of one kind a sweep must see for a user: open ones and, per kind, history."""
    rows = EmailNotification.objects.filter(kind=kind)
    if kind == Kind.NEW_PROPOSAL:  # one notice per proposal, ever: see them all while in review
        rows = rows.filter(Q(status__in=OPEN) | Q(proposal__status=Proposal.Status.IN_REVIEW))
    elif kind == Kind.PROPOSAL_REVIEW:
        # Answered proposals are not asked again; nor are those whose request failed for good
        # (an operator retries it from the admin) - else a bad address would loop forever.
        rows = rows.filter(
            Q(status__in=OPEN)
            | Q(
                status__in=[Status.RESPONDED, Status.FAILED, Status.SUPPRESSED],
                proposal__status=Proposal.Status.IN_REVIEW,
            )
        )
    else:
        rows = rows.filter(status__in=OPEN)
    return rows.only(
        "id",
        "user_id",
        "kind",
        "proposal_id",
        "status",
        "attempts",
        "retry_after",
        "expires_at",
        "token",
    ).order_by("pk")


def sweep_candidates(*, kind: str, now: datetime) -> QuerySet[AbstractBaseUser]:
    """Users this sweep may have to act for (a superset; the planner decides)."""
    users = get_user_model().objects.all()
    needs_work = EmailNotification.objects.filter(kind=kind).filter(
        Q(status=Status.PENDING) | Q(status=Status.SENT, expires_at__lte=now)
    )
    condition = Q(pk__in=needs_work.values("user_id"))
    in_review = Proposal.objects.filter(status=Proposal.Status.IN_REVIEW)
    if kind == Kind.NEW_PROPOSAL:
        noticed = EmailNotification.objects.filter(
            kind=kind, proposal=OuterRef("pk"), user=OuterRef("pi")
        )
        # Digest-rung users read new proposals in their digest; paused users get nothing.
        fresh = in_review.exclude(Exists(noticed)).exclude(
            pi__notification_preference__rung__in=[Rung.DAILY, Rung.WEEKLY, Rung.PAUSED]
        )
        condition |= Q(pk__in=fresh.values("pi_id"))
    elif kind == Kind.PROPOSAL_REVIEW:
        asked = EmailNotification.objects.filter(
            kind=kind,
            proposal=OuterRef("pk"),
            user=OuterRef("pi"),
            status__in=[*OPEN, Status.RESPONDED, Status.FAILED, Status.SUPPRESSED],
        )
        fresh = in_review.exclude(Exists(asked)).exclude(
            pi__notification_preference__rung=Rung.PAUSED
        )
        condition |= Q(pk__in=fresh.values("pi_id"))
    else:
        condition |= Q(
            pk__in=in_review.values("pi_id"),
            notification_preference__rung__in=[Rung.DAILY, Rung.WEEKLY],
        )
    return users.filter(condition)


def sweep_user_batch(
    *, kind: str, now: datetime, after_id: int, limit: int
) -> list[AbstractBaseUser]:
    """The next `limit` candidate users after `after_id` (keyset pagination), fully loaded.

    Each user carries: `notification_preference` (joined; may be missing: defaults apply),
    `proposals_in_review`, `kind_rows` (see _rows_of_kind), `last_sent_at` (of this kind) and
    `is_suppressed` (the address is on the suppression list: notifications/suppression.py).
    """
    suppressed = active_suppressions(now=now).filter(address=Lower(OuterRef("email")))
    last_sent = (
        EmailNotification.objects.filter(user=OuterRef("pk"), kind=kind, sent_at__isnull=False)
        .order_by("-sent_at")
        .values("sent_at")[:1]
    )
    return list(
        sweep_candidates(kind=kind, now=now)
        .filter(pk__gt=after_id)
        .order_by("pk")
        .select_related("notification_preference")
        .annotate(last_sent_at=Subquery(last_sent), is_suppressed=Exists(suppressed))
        .prefetch_related(
            Prefetch(
                "proposals",
                queryset=Proposal.objects.filter(status=Proposal.Status.IN_REVIEW)
                .only("id", "pi_id", "title", "created_at")
                .order_by("created_at", "pk"),
                to_attr="proposals_in_review",
            ),
            Prefetch("email_notifications", queryset=_rows_of_kind(kind), to_attr="kind_rows"),
        )[:limit]
    )


# --- replies ----------------------------------------------------------------------------------


class _ReplyWindow(Protocol):
    """What the reply rules read of a notification (a row, or another app's snapshot of it)."""

    status: str
    expires_at: datetime | None


def notification_has_expired(*, notification: _ReplyWindow, now: datetime) -> bool:
    """Expired by the sweep, or past `expires_at` and not yet swept."""
    if notification.status == Status.EXPIRED:
        return True
    return notification.expires_at is not None and notification.expires_at <= now


def notification_is_open_for_replies(*, notification: _ReplyWindow, now: datetime) -> bool:
    """Is this notification open for replies? Sent and not expired; an answered one stays
    open (a PI may send several instructions; the inbound rate limit bounds them)."""
    return not notification_has_expired(notification=notification, now=now) and (
        notification.status in (Status.SENT, Status.RESPONDED)
    )


def notification_status_counts() -> dict[str, int]:
    """Notification rows per status, only the statuses that have rows, in name order."""
    rows = EmailNotification.objects.values("status").annotate(n=Count("id")).order_by("status")
    return {row["status"]: row["n"] for row in rows}


def notifications_stuck_sending(*, now: datetime) -> QuerySet[EmailNotification]:
    """Rows left `sending` past NOTIFICATION_CLAIM_TIMEOUT_SECONDS: their worker crashed
    between the claim and SES (or the sweeps stopped), and the reconciler hands them back."""
    cutoff = now - timedelta(seconds=get_config().claim_timeout_seconds)
    return EmailNotification.objects.filter(status=Status.SENDING, claimed_at__lt=cutoff)


def sending_pause(*, now: datetime) -> dict[str, object]:
    """The shared pace and pause as an operator reads them (notifications/pacing.py):
    `paused_until` (ISO, or None when sending goes on), `reason`, `paused_since`, and the
    `max_send_rate` last read from SES (None before the first paced send)."""
    state = SendingState.objects.filter(pk=1).first()
    paused = state is not None and state.paused_until is not None and state.paused_until > now
    return {
        "paused_until": state.paused_until.isoformat() if paused else None,
        "paused_since": state.paused_at.isoformat() if paused and state.paused_at else None,
        "reason": state.pause_reason if paused else "",
        "max_send_rate": state.max_send_rate if state is not None else None,
    }


def feedback_last_24_hours(*, now: datetime) -> dict[str, float]:
    """Bounce and complaint rates of the last 24 h, as SES computes them for its review of an
    account (5 % bounces, 0.1 % complaints): hard bounces and complaints received over the
    mails sent in the same 24 h; plus the raw counts and the active suppressions."""
    since = now - timedelta(hours=24)
    sent = EmailNotification.objects.filter(sent_at__gt=since, sent_at__lte=now).count()
    counts = dict(
        DeliveryFeedback.objects.filter(occurred_at__gt=since, occurred_at__lte=now)
        .values_list("kind")
        .annotate(n=Count("id"))
        .values_list("kind", "n")
    )
    hard = counts.get(DeliveryFeedback.Kind.HARD_BOUNCE, 0)
    complaints = counts.get(DeliveryFeedback.Kind.COMPLAINT, 0)
    return {
        "sent": sent,
        "hard_bounces": hard,
        "soft_bounces": counts.get(DeliveryFeedback.Kind.SOFT_BOUNCE, 0),
        "complaints": complaints,
        "bounce_rate": hard / sent if sent else 0.0,
        "complaint_rate": complaints / sent if sent else 0.0,
        "bounce_percent": round(100 * hard / sent, 2) if sent else 0.0,
        "complaint_percent": round(100 * complaints / sent, 3) if sent else 0.0,
        "suppressed_addresses": active_suppressions(now=now).count(),
    }
