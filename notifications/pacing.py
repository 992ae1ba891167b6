"""Sending at the account's pace, and pausing all sending while its daily quota is spent.

SES refuses what goes over the account's MaxSendRate ("Maximum sending rate exceeded") or
its daily quota ("Daily message quota exceeded"). Both used to count as failed sends: a burst
of due notices ended partly `failed` for a limit that cleared in a second, and every notice
over the daily quota ended `failed` after its attempts.

* **The pace** is one token bucket in the database (the SendingState row), shared by every
  worker process and container: before each send a process reserves the next slot with one
  UPDATE (`next_slot_at = greatest(next_slot_at, now) + 1/rate`, on PostgreSQL's clock) and
  sleeps until its slot. Slots are 1/rate apart whoever takes them, so N processes together
  keep to the rate, not N times it. The rate is NOTIFICATION_SEND_RATE when set, else SES's
  MaxSendRate from GetSendQuota, kept in the row and re-read every
  NOTIFICATION_SEND_QUOTA_REFRESH_SECONDS. A sender that cannot report a quota (Django's
  EMAIL_BACKEND) is not paced unless NOTIFICATION_SEND_RATE is set.
* **A rate refusal** (SendThrottled) is no attempt: the delivery waits
  NOTIFICATION_THROTTLE_RETRY_SECONDS, takes a new slot and tries again (sweep_delivery.py).
* **A daily-quota refusal** (SendQuotaExceeded), or a GetSendQuota answer that shows the quota
  spent, **pauses** all sending for NOTIFICATION_SEND_PAUSE_SECONDS. The claims in hand go
  back to `pending` without spending an attempt; the sweeps claim nothing while paused (new
  notices wait as `pending`). When the pause ends, the first process to look asks SES again:
  still spent, the pause is extended; freed, sending resumes. Nothing fails for the quota.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import BooleanField, ExpressionWrapper, F, Q, Value
from django.db.models.functions import Coalesce, Greatest, Now

from notifications.conf import get_config
from notifications.models import SendingState
from notifications.senders.base import EmailSender, SendError, SendQuota

logger = logging.getLogger(__name__)

# Without a figure from SES (GetSendQuota failing, nothing stored yet): a new SES account's rate.
FALLBACK_RATE = 1.0

_TAKE_SLOT = f"""
INSERT INTO {SendingState._meta.db_table} (id, next_slot_at, pause_reason)
VALUES (1, clock_timestamp() + make_interval(secs => %(interval)s), '')
ON CONFLICT (id) DO UPDATE SET next_slot_at =
    greatest({SendingState._meta.db_table}.next_slot_at, clock_timestamp())
    + make_interval(secs => %(interval)s)
RETURNING next_slot_at - make_interval(secs => %(interval)s),
          extract(epoch FROM next_slot_at - clock_timestamp())::float8 - %(interval)s
"""


@dataclass(frozen=True)
class Slot:
    at: datetime  # when this send may leave (the database's clock)
    wait_seconds: float  # how long from now until then (0 when it is already due)


def take_send_slot(rate: float) -> Slot:
    """Reserve the next send slot of the shared bucket at `rate` mails per second.

    One statement in its own transaction (autocommit): the row lock is held for the UPDATE
    only, and slots come out 1/rate apart in the order processes ask, whichever they are.
    """
    if rate <= 0 or not math.isfinite(rate):
        raise ValueError(f"a send rate must be a positive number, not {rate!r}")
    with connection.cursor() as cursor:
        cursor.execute(_TAKE_SLOT, {"interval": 1.0 / rate})
        at, wait = cursor.fetchone()
    return Slot(at=at, wait_seconds=max(0.0, wait))


def _state() -> SendingState:
    state, _ = SendingState.objects.get_or_create(pk=1)
    return state


def _ask_quota(sender: EmailSender) -> SendQuota | None:
    """The service's figures, None when the sender has none or the call failed (logged)."""
    ask = getattr(sender, "send_quota", None)
    if ask is None:
        return None
    try:
        return ask()
    except SendError as exc:
        logger.warning(
            "could not read the sending quota: %s",
            exc,
            extra={"action": "notification_quota_unreadable"},
        )
        return None


def record_quota(quota: SendQuota) -> None:
    """Keep SES's figures for every process (stamped with the database's time, which every
    host shares: they are fresh for NOTIFICATION_SEND_QUOTA_REFRESH_SECONDS)."""
    _state()
    SendingState.objects.filter(pk=1).update(
        max_send_rate=quota.max_send_rate,
        max_24_hour_send=quota.max_24_hour_send,
        sent_last_24_hours=quota.sent_last_24_hours,
        quota_checked_at=Now(),
    )


def pause_sending(*, until: datetime, reason: str, now: datetime) -> datetime:
    """Pause all sending until `until` (a later pause already set is kept); return the end."""
    state = _state()
    SendingState.objects.filter(pk=1).update(
        paused_until=Greatest(Coalesce(F("paused_until"), Value(until)), Value(until)),
        paused_at=Coalesce(F("paused_at"), Value(now)),
        pause_reason=reason[:500],
    )
    if state.paused_until is None:
        logger.warning(
            "sending paused until %s: %s",
            until.isoformat(),
            reason,
            extra={"action": "notification_sending_paused"},
        )
    return max(until, state.paused_until or until)


def _resume(*, paused_until: datetime) -> None:
    """End the pause that ended at `paused_until` (not a newer one another process set)."""
    resumed = SendingState.objects.filter(pk=1, paused_until=paused_until).update(
        paused_until=None, paused_at=None, pause_reason=""
    )
    if resumed:
        logger.info("sending resumed", extra={"action": "notification_sending_resumed"})


class Pacer:
    """One delivery run's view of the shared pace and pause (built per sweep cycle)."""

    def __init__(self, sender: EmailSender) -> None:
        self._sender = sender
        self._rate: float | None = None
        self._rate_read_at = -math.inf  # monotonic
        # Set when GetSendQuota showed the daily quota spent: the delivery holds its claims
        # instead of asking SES for a refusal.
        self.quota_spent: str = ""

    def rate(self) -> float | None:
        """Mails per second for all processes together; None: this sender is not paced."""
        config = get_config()
        if config.send_rate:
            return config.send_rate
        if time.monotonic() - self._rate_read_at < config.send_quota_refresh_seconds:
            return self._rate
        self._rate = self._account_rate(config.send_quota_refresh_seconds)
        self._rate_read_at = time.monotonic()
        return self._rate

    def _account_rate(self, refresh_seconds: int) -> float | None:
        if getattr(self._sender, "send_quota", None) is None:
            return None
        # Fresh is judged by the database's clock, as the figures were stamped (issue 22).
        state, _ = SendingState.objects.annotate(
            quota_fresh=ExpressionWrapper(
                Q(quota_checked_at__gt=Now() - timedelta(seconds=refresh_seconds)),
                output_field=BooleanField(),
            )
        ).get_or_create(pk=1)
        fresh = bool(getattr(state, "quota_fresh", False))
        if fresh and state.max_send_rate:
            return state.max_send_rate
        quota = _ask_quota(self._sender)
        if quota is None or quota.max_send_rate <= 0:
            return state.max_send_rate or FALLBACK_RATE
        record_quota(quota)
        if quota.exhausted:
            self.quota_spent = (
                f"daily quota spent: {quota.sent_last_24_hours:.0f} of "
                f"{quota.max_24_hour_send:.0f} sent in the last 24 h (GetSendQuota)"
            )
        return quota.max_send_rate

    def wait_for_slot(self) -> None:
        """Sleep until this process may send its next mail."""
        rate = self.rate()
        if rate is None:
            return
        slot = take_send_slot(rate)
        if slot.wait_seconds > 0:
            time.sleep(slot.wait_seconds)

    def hold_until(self, now: datetime) -> datetime | None:
        """The end of the sending pause, or None when sending may go on.

        A pause that has run out is checked with the service first: still spent, it is
        extended by NOTIFICATION_SEND_PAUSE_SECONDS; freed (or the sender cannot say), sending
        resumes.
        """
        state = SendingState.objects.filter(pk=1).first()
        if state is None or state.paused_until is None:
            return None
        if state.paused_until > now:
            return state.paused_until
        quota = _ask_quota(self._sender)
        if quota is not None:
            record_quota(quota)
            if quota.exhausted:
                return pause_sending(
                    until=now + timedelta(seconds=get_config().send_pause_seconds),
                    reason=state.pause_reason or "daily quota spent",
                    now=now,
                )
        _resume(paused_until=state.paused_until)
        return None

    def quota_refused(self, error: SendError, now: datetime) -> datetime:
        """The service refused a send for the daily quota: pause all sending; the end."""
        return pause_sending(
            until=now + timedelta(seconds=get_config().send_pause_seconds),
            reason=str(error),
            now=now,
        )
