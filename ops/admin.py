"""django-q2's admins, tightened: the task action behind the change permission, schedules
whose function nobody edits, and the record of refused tasks.

django-q2 registers "Resubmit selected tasks to queue" on successful and failed tasks without
`allowed_permissions`, so a view-only staff user could run tasks again (and delete failed
ones). Every admin action that writes declares the permission it needs (issue 10); this
module re-registers the two admins with a guarded copy of the action. `ops` comes before
`django_q` in INSTALLED_APPS, so django-q2's admin module is imported here first.

Schedules come only from code (issue 19, ops/schedules.py): the admin adds none, and shows a
schedule's function, hook and arguments read-only. The worker refuses a task naming anything
else however the row was written (ops/task_guard.py); this keeps the admin from being the way.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django_q import admin as q_admin
from django_q.models import Failure, Schedule, Success

from ops.models import RefusedTask


@admin.action(description="Resubmit selected tasks to queue", permissions=["change"])
def resubmit_task(model_admin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    q_admin.resubmit_task(model_admin, request, queryset)


class TaskAdmin(q_admin.TaskAdmin):
    actions = [resubmit_task]


class FailAdmin(q_admin.FailAdmin):
    actions = [resubmit_task]


class ScheduleAdmin(q_admin.ScheduleAdmin):
    readonly_fields = (
        *q_admin.ScheduleAdmin.readonly_fields,
        *("func", "hook", "args", "kwargs", "cluster", "intended_date_kwarg"),
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(RefusedTask)
class RefusedTaskAdmin(admin.ModelAdmin):
    """Read-only; deleting a row acknowledges it (worker_status stops listing it)."""

    list_display = ("refused_at", "source", "func", "group", "task_name", "reason")
    list_filter = ("source",)
    search_fields = ("func", "group", "task_name")
    date_hierarchy = "refused_at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: RefusedTask | None = None) -> bool:
        return False


for _model, _admin_class in (
    (Success, TaskAdmin),
    (Failure, FailAdmin),
    (Schedule, ScheduleAdmin),
):
    if admin.site.is_registered(_model):
        admin.site.unregister(_model)
    admin.site.register(_model, _admin_class)
