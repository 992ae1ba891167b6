"""What the worker refused to run: the trace of a hostile or stale task (issue 19)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class RefusedTask(models.Model):
    """One django-q2 task that named a function outside the allowlist (ops/task_guard.py).

    Written by the process that refused it (the enqueuing one, or the cluster's pusher for a
    row that reached the broker some other way); read by worker_status, the health page and
    /metrics. Deleting a row is how an operator acknowledges it.
    """

    class Source(models.TextChoices):
        ENQUEUE = "enqueue", "enqueue (a schedule, the admin, code)"
        BROKER = "broker", "broker row (written past django-q2)"

    refused_at = models.DateTimeField(default=timezone.now, db_index=True)
    source = models.CharField(max_length=20, choices=Source.choices)
    func = models.TextField(help_text="the function the task named (never imported)")
    hook = models.TextField(blank=True)
    task_name = models.CharField(max_length=200, blank=True)
    group = models.CharField(
        max_length=200, blank=True, help_text="for a scheduled task: the schedule's name"
    )
    reason = models.TextField()

    class Meta:
        ordering = ["-refused_at", "-id"]

    def __str__(self) -> str:
        return f"refused {self.func} ({self.source})"
