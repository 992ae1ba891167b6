"""Models of the canonical_ids app: the messages table and the writer-slot leases."""

from __future__ import annotations

from django.db import models


class Message(models.Model):
    """One message of a run, keyed by its canonical id `ts` (the "database inbox").

    The database is the only durable store of a message, so `(run_id, ts)` is unique and a
    conflict is never resolved by dropping a row (see services.record_message).
    """

    run_id = models.CharField(max_length=64)
    ts = models.CharField(max_length=17)  # "SSSSSSSSSS.uuuuuu"
    author = models.CharField(max_length=128)
    source = models.CharField(max_length=32)
    text = models.TextField()
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run_id", "ts"]
        constraints = [
            models.UniqueConstraint(fields=["run_id", "ts"], name="uq_canonical_message_run_ts"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}/{self.ts} ({self.source})"


class WriterSlotLease(models.Model):
    """Who holds a writer slot, until when, and the last id the slot issued.

    Rows are written only by canonical_ids.leases on its own connection, so a lease never
    rolls back with a caller's transaction. `holder_token` is the claim's identity: renewal
    and release match on it, so a process that lost its lease cannot renew someone else's.
    """

    slot = models.PositiveSmallIntegerField(primary_key=True)
    role = models.CharField(max_length=32, blank=True, default="")
    holder_token = models.CharField(max_length=32, blank=True, default="")
    holder_host = models.CharField(max_length=255, blank=True, default="")
    holder_pid = models.IntegerField(null=True, blank=True)
    holder_started_at = models.DateTimeField(null=True, blank=True)
    acquired_at = models.DateTimeField(null=True, blank=True)
    renewed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)  # NULL: free
    last_ts = models.CharField(max_length=17, blank=True, default="")

    class Meta:
        ordering = ["slot"]

    def __str__(self) -> str:
        holder = f"{self.holder_host}:{self.holder_pid}" if self.holder_pid else "free"
        return f"slot {self.slot} ({holder})"
