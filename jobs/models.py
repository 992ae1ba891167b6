"""The Job row: the durable source of truth of the job loop (django-q2 tasks only wake it)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone


class Job(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        PROCESSING = "processing", "Processing"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    kind = models.CharField(max_length=100)
    payload = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED)
    priority = models.IntegerField(default=0, help_text="Higher runs first.")
    # Counted when a worker claims the row, so a job that kills its worker still runs out.
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField()
    run_after = models.DateTimeField(default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True, help_text="Start of the last attempt.")
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(
        null=True, blank=True, help_text="After this the reaper may reclaim a processing row."
    )
    locked_by = models.CharField(
        max_length=200, blank=True, help_text="The worker run that owns the processing row."
    )
    completed_at = models.DateTimeField(null=True, blank=True, help_text="Set on success only.")
    failed_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        indexes = [
            # Serves the claim: WHERE status='queued' AND run_after <= now ORDER BY priority DESC,
            # run_after, id. Partial, so it stays small however many finished rows accumulate.
            models.Index(
                fields=["-priority", "run_after", "id"],
                name="jobs_job_claim_idx",
                condition=Q(status="queued"),
            ),
            # Serves the reaper (expired leases) without scanning finished rows.
            models.Index(
                fields=["lease_expires_at"],
                name="jobs_job_lease_idx",
                condition=Q(status="processing"),
            ),
            # Serves pruning and the admin's per-status counts.
            models.Index(fields=["status", "completed_at"], name="jobs_job_status_done_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(attempts__lte=models.F("max_attempts")),
                name="jobs_job_attempts_lte_max",
            ),
            models.CheckConstraint(
                condition=Q(completed_at__isnull=True) | Q(status="completed"),
                name="jobs_job_completed_at_only_when_completed",
            ),
        ]

    def __str__(self) -> str:
        return f"job #{self.pk} {self.kind} ({self.status})"
