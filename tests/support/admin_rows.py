"""Rows for every model the admin registers, with long values where a page could overflow,
so a test can open every changelist, change page and confirmation page with a row in it.

`console_rows()` returns the pages that are not a model's standard ones (the Worker health
page at each range, the error groups, a quarantined mail); `admin_pages()` lists every page of
every registered ModelAdmin (changelist, change, history, add and delete when permitted) and
the no-argument views the ModelAdmins add, so a new model or view is covered without editing
a list by hand.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db import connection
from django.urls import reverse
from django.utils import timezone
from model_bakery import baker

from tests.support.browser import PASSWORD

LONG = "ValueError: " + "a-very-long-unbroken-token-" * 12
HOST = "worker-host-with-a-long-name.example.internal"


def console_rows(user_model: Any) -> dict[str, str]:
    """One row (or more) of every registered model; returns the custom pages by name."""
    from django.contrib.auth.models import Group
    from django_q.models import OrmQ, Schedule, Task

    from canonical_ids.models import Message, WriterSlotLease
    from inbound_email.models import InboundEmail, Reply, ReplyAttachment
    from jobs.models import Job, JobAttempt, KindCap, KindRate, PausedKind
    from notifications.models import (
        DeliveryFeedback,
        EmailNotification,
        NotificationPreference,
        Proposal,
        Suppression,
        UnsubscribeRevocation,
    )
    from ops.models import JobPeriod, RefusedTask
    from processes.models import WorkerProcess

    now = timezone.now()
    # Ids as a deployment's are after a year: seven digits widen the id column (the job
    # list at 1366 px hid 5 px of its last column behind a scroll bar, seen only when the
    # suite's million-row tests had run first on the same database).
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence('jobs_job', 'id'), "
            "greatest(9999999, (SELECT coalesce(max(id), 0) FROM jobs_job)))"
        )
    failed = baker.make(
        Job,
        kind="report.render",
        status="failed",
        attempts=2,
        max_attempts=2,
        failed_at=now,
        last_error=f"{LONG}\n\nTraceback (most recent call last):\n  File x",
        locked_by="",
    )
    for number, outcome in ((1, "retried"), (2, "failed")):
        JobAttempt.objects.create(
            job_id=failed.pk,
            number=number,
            worker=f"{HOST}:31337:0badc0de",
            started_at=now - timedelta(seconds=30 * number),
            finished_at=now - timedelta(seconds=30 * number - 2),
            outcome=outcome,
            error=LONG,
        )
    baker.make(
        Job,
        kind="mail.relay",
        status="processing",
        attempts=1,
        max_attempts=5,
        locked_by=f"{HOST}:4242:deadbeef",
        lease_expires_at=now - timedelta(minutes=4),
    )
    baker.make(Job, kind="report.render", status="completed", max_attempts=1, completed_at=now)
    PausedKind.objects.create(kind="report.render", paused_by="admin")
    KindCap.objects.create(kind="report.render", concurrency=5)  # a worker's start writes it
    KindRate.objects.create(  # a worker's start writes it (issue 38, point 3)
        kind="report.render", rate="20/s", interval_seconds=0.05, next_slot_at=now
    )
    baker.make(
        WorkerProcess,
        role="qcluster worker",
        host=HOST,
        pid=4242,
        version="0.1.0",
        started_at=now - timedelta(hours=2),
        heartbeat_at=now,
        interval_seconds=10,
        gone_after=now + timedelta(seconds=30),
        stopped_at=now,
        current="job #12345 report.render",
    )
    mail = baker.make(
        InboundEmail,
        store_key="inbound/" + "k" * 120,
        status="quarantined",
        reason="permanent_error",
        detail="the parser gave up",
        raw=(
            b"From: Ada <pi@university.example>\r\nTo: replies@reply.example\r\n"
            b"Subject: " + b"very long subject " * 10 + b"\r\n\r\nbody\r\n"
        ),
        last_error="Traceback (most recent call last):\n  File y\nRuntimeError: boom",
    )
    JobPeriod.objects.create(  # the per-kind table, with a long kind name
        start=now,
        kind="reports.render_the_quarterly_statistics_for_the_board_of_trustees",
        shard=0,
        completed=1234,
        failed=5,
        durations=[0] * 12 + [1234],
        waits=[1239] + [0] * 11,
    )
    user_model.objects.create_superuser(username="operator", password=PASSWORD)
    pi = user_model.objects.create_user(
        username="pi", email="principal.investigator.with.a.long.name@university.example"
    )
    NotificationPreference.objects.create(user=pi)
    proposal = Proposal.objects.create(title="A proposal " * 8, pi=pi, run_id="run-1")
    notification = baker.make(
        EmailNotification,
        user=pi,
        proposal=proposal,
        kind="new_proposal",
        to_address=pi.email,
        sent_at=now,
    )
    processed = baker.make(InboundEmail, store_key="inbound/replied", status="processed")
    reply = baker.make(Reply, inbound_email=processed, notification=notification, rating=4)
    baker.make(
        ReplyAttachment,
        reply=reply,
        index=1,
        filename="budget-" + "x" * 80 + ".pdf",
        content_type="application/pdf",
        size=1234,
        sha256="0" * 64,
        state="stored",
    )
    baker.make(UnsubscribeRevocation, notification=notification, reason="forwarded to a list")
    Suppression.objects.create(
        address="gone@example.net", reason="hard_bounce", suppressed_at=now, source_report="5.1.1"
    )
    baker.make(DeliveryFeedback, address="gone@example.net", kind="hard_bounce", occurred_at=now)
    Message.objects.create(run_id="run-1", ts="1733330765.000101", author="pi", text="hello")
    WriterSlotLease.objects.update_or_create(
        slot=42,
        defaults={
            "role": "worker",
            "holder_host": HOST,
            "holder_pid": 4242,
            "acquired_at": now,
            "renewed_at": now,
            "expires_at": now + timedelta(seconds=60),
        },
    )
    Group.objects.create(name="operators")
    RefusedTask.objects.create(
        source="schedule", func="os.system", reason="not a task defined in code"
    )
    Schedule.objects.create(name="a schedule", func="ops.tasks.reap", schedule_type="I")
    for success in (True, False):
        Task.objects.create(
            id=f"task{success:d}" + "0" * 27,
            name=f"task-{success}",
            func="ops.tasks.reap",
            started=now,
            stopped=now,
            success=success,
        )
    OrmQ.objects.create(key="default", payload="not a signed task", lock=now)
    return {
        "health": reverse("ops:worker_health"),
        "health-1h": reverse("ops:worker_health") + "?range=1h",
        "health-7d": reverse("ops:worker_health") + "?range=7d",
        "stuck": reverse("admin:jobs_job_changelist") + "?health=stuck",
        "quarantined-mail": reverse("admin:inbound_email_inboundemail_change", args=[mail.pk]),
        "failed-job": reverse("admin:jobs_job_change", args=[failed.pk]),
    }


def admin_pages(request: Any) -> dict[str, str]:
    """Every page of every registered ModelAdmin that `request.user` may open, by name:
    changelist, change (first row), history, add and delete where permitted, and each extra
    view a ModelAdmin adds that takes no argument (e.g. "Failed jobs by error")."""
    pages = {"index": reverse("admin:index")}
    missing = []
    for model, model_admin in admin.site._registry.items():
        opts = model._meta
        name = f"{opts.app_label}_{opts.model_name}"
        pages[f"{name}-list"] = reverse(f"admin:{name}_changelist")
        if model_admin.has_add_permission(request):
            pages[f"{name}-add"] = reverse(f"admin:{name}_add")
        obj = model_admin.get_queryset(request).first()
        if obj is None:
            missing.append(opts.label)
            continue
        pages[f"{name}-change"] = reverse(f"admin:{name}_change", args=[obj.pk])
        pages[f"{name}-history"] = reverse(f"admin:{name}_history", args=[obj.pk])
        if model_admin.has_delete_permission(request, obj):
            pages[f"{name}-delete"] = reverse(f"admin:{name}_delete", args=[obj.pk])
        for pattern in model_admin.get_urls():
            route = str(pattern.pattern)
            if pattern.name and "<" not in route and route and not route.startswith("add"):
                pages[pattern.name] = reverse(f"admin:{pattern.name}")
    if missing:
        raise AssertionError(f"no row to open for {missing}: add one to console_rows()")
    return pages
