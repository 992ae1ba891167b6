"""The process registry: one row per running (or recently ended) worker process."""

from __future__ import annotations

from django.db import models


class WorkerProcess(models.Model):
    """A qcluster, one of its worker processes, or a service loop (`run_jobs`,
    `poll_inbound_email`, `run_sweeps`), as it registered itself.

    Every time here is the database's (`now()` in the statement), never a host's: hosts'
    clocks may differ by minutes. `gone_after` is pushed forward by every beat to
    `now() + MISSED_BEATS * interval`; a process is live while it is ahead and `stopped_at`
    is NULL. Rows are written only by processes.services on a connection of its own.
    """

    class Role(models.TextChoices):
        QCLUSTER = "qcluster", "qcluster"
        QCLUSTER_WORKER = "qcluster worker", "qcluster worker"
        RUN_JOBS = "run_jobs", "run_jobs"
        POLL_INBOUND_EMAIL = "poll_inbound_email", "poll_inbound_email"
        RUN_SWEEPS = "run_sweeps", "run_sweeps"

    role = models.CharField(max_length=32, choices=Role.choices)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    version = models.CharField(max_length=64)
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    interval_seconds = models.FloatField()
    gone_after = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)  # a clean stop; NULL otherwise
    current = models.CharField(max_length=300, blank=True, default="")
    # A job worker's slots as of its last beat (issue 37, point 10): {"threads": N,
    # "async": N, "busy": {kind: slots in use}}; NULL for a process that runs no jobs (and
    # for rows of a release before it, which insert without it).
    slots = models.JSONField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "worker processes"  # Django's default: "worker processs"
        ordering = ["-heartbeat_at"]
        indexes = [models.Index(fields=["heartbeat_at"], name="processes_heartbeat_idx")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(interval_seconds__gt=0), name="processes_interval_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.role} {self.host}:{self.pid}"
