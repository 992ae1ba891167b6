"""Admin: the read-only process registry (live and gone), filtered by the selectors."""

from __future__ import annotations

from django.contrib import admin

from processes.models import WorkerProcess
from processes.selectors import processes_gone, processes_gone_recently, processes_live
from project.admin import ReadOnlyAdmin, SelectorFilter


class ProcessHealthFilter(SelectorFilter):
    choices_by_value = {
        "live": ("Live", lambda now: processes_live()),
        "gone_recently": ("Gone in the last hour", lambda now: processes_gone_recently()),
        "gone": ("Gone (stopped or silent)", lambda now: processes_gone()),
    }


@admin.register(WorkerProcess)
class WorkerProcessAdmin(ReadOnlyAdmin):
    list_display = (
        "role",
        "host",
        "pid",
        "version",
        "started_at",
        "heartbeat_at",
        "stopped_at",
        "current",
    )
    list_filter = (ProcessHealthFilter, "role")
    search_fields = ("host", "=pid")
