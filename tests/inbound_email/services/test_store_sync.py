"""Store sync: the store follows the ledger after commit; a key still listed for a finished
row is cleaned up, never handled twice (inbound_email/services/store_sync.py)."""

from __future__ import annotations

import pytest

from inbound_email.exceptions import StoreError
from inbound_email.models import InboundEmail, Reply
from inbound_email.poller import poll_once
from tests.support.mail import build_mail
from tests.support.stores import intake_keys, key

pytestmark = pytest.mark.django_db


def test_redelivered_object_with_the_same_key_is_handled_once(store, notification):
    mail = build_mail(token=notification.token, body="4")
    store.put(key(store, "k"), mail)
    poll_once()
    store.put(key(store, "k"), mail)  # SES redelivers the same object
    summary = poll_once()
    assert summary.outcomes["cleaned_up"] == 1
    assert InboundEmail.objects.count() == 1 and Reply.objects.count() == 1
    assert intake_keys(store) == []


Status = InboundEmail.Status
Reason = InboundEmail.Reason


class FaultyStore:
    """Our real store, whose `quarantine()` / `delete_many()` fail a set number of times.

    `delete_mode`: "errors" answers the second half of the keys with per-key errors (what
    S3's DeleteObjects does); "raises" deletes the first half, then raises (a connection
    lost midway through a batch).
    """

    def __init__(
        self,
        inner,
        *,
        quarantine_failures: int = 0,
        delete_failures: int = 0,
        delete_mode: str = "errors",
    ) -> None:
        self.inner = inner
        self.description = f"faulty {inner.description}"
        self.quarantine_failures = quarantine_failures
        self.delete_failures = delete_failures
        self.delete_mode = delete_mode

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def quarantine(self, key: str) -> str:
        if self.quarantine_failures:
            self.quarantine_failures -= 1
            raise StoreError(f"SlowDown on copy of {key}", transient=True)
        return self.inner.quarantine(key)

    def delete_many(self, keys: list[str]) -> dict[str, str]:
        if not self.delete_failures:
            return self.inner.delete_many(keys)
        self.delete_failures -= 1
        half = len(keys) // 2
        failed = self.inner.delete_many(keys[:half])
        if self.delete_mode == "raises":
            raise StoreError("connection reset during DeleteObjects", transient=True)
        return {
            **failed,
            **{k: "InternalError: We encountered an internal error" for k in keys[half:]},
        }


def test_a_failed_quarantine_copy_keeps_the_mail_in_the_intake_for_the_next_poll(
    store, notification, settings
):
    """Mutant: no `continue` after a failed quarantine() deletes the only copy of the mail."""
    settings.INBOUND_EMAIL_MAX_BYTES = 2048
    raw = build_mail(token=notification.token, body="x" * 3000)
    store.put(key(store, "big"), raw)
    faulty = FaultyStore(store, quarantine_failures=1)

    poll_once(store=faulty)

    row = InboundEmail.objects.get()
    assert (row.status, row.reason) == (Status.QUARANTINED, Reason.OVERSIZE)
    assert (row.quarantine_key, row.intake_deleted) == ("", False)
    assert intake_keys(store) == [key(store, "big")]  # still the only copy, still there

    summary = poll_once(store=faulty)  # S3 answers again

    assert summary.outcomes == {"cleaned_up": 1}
    row.refresh_from_db()
    assert row.intake_deleted is True
    assert row.quarantine_key == "quarantine/" + key(store, "big")
    assert store.get_quarantined(row.quarantine_key) == raw
    assert intake_keys(store) == []


@pytest.mark.parametrize("delete_mode", ["errors", "raises"])
def test_a_delete_failing_partway_marks_only_what_is_gone_and_the_next_poll_finishes(
    store, notification, settings, delete_mode
):
    """Mutant: marking every row `intake_deleted` whether or not its delete succeeded."""
    settings.MAX_REPLIES_PER_TOKEN_PER_HOUR = 100
    settings.INBOUND_EMAIL_MAX_BYTES = 2048
    for i in range(4):
        store.put(key(store, f"ok{i}"), build_mail(token=notification.token, body=f"{i + 1}"))
    store.put(key(store, "poison"), build_mail(token=notification.token, body="x" * 3000))
    faulty = FaultyStore(store, delete_failures=1, delete_mode=delete_mode)

    poll_once(store=faulty)

    rows = list(InboundEmail.objects.order_by("store_key"))
    assert [r.status for r in rows] == [Status.PROCESSED] * 4 + [Status.QUARANTINED]
    left = set(intake_keys(store))
    assert left  # the batch broke off partway: some keys are still in the intake
    # What the ledger says is what the store holds: nothing is marked gone that is not.
    assert [r.store_key for r in rows if r.intake_deleted and r.store_key in left] == []
    if delete_mode == "errors":  # the keys S3 did delete are marked
        assert {r.store_key for r in rows if r.intake_deleted} == {r.store_key for r in rows} - left
    poison = rows[-1]
    assert store.get_quarantined(poison.quarantine_key)  # copied before any delete

    poll_once(store=faulty)  # the store answers again

    assert intake_keys(store) == []
    assert all(r.intake_deleted for r in InboundEmail.objects.filter(store_key__in=left))
    assert store.get_quarantined(poison.quarantine_key)
