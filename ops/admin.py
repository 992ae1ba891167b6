"""django-q2's admins, tightened: the task action behind the change permission, schedules
whose function nobody edits, and the record of refused tasks.

django-q2 registers "Resubmit selected tasks to queue" on successful and failed tasks without
`allowed_permissions`, so a view-only staff user could run tasks again (and delete failed
ones). Every admin action that writes declares the permission it needs (issue 10); this
module re-registers the two admins with a guarded copy of the action. `ops` comes before
`django_q` in INSTALLED_APPS, so django-q2's admin module is imported here first.

A task's args, kwargs and result are unsigned pickles: the task admins read them as plain data
only (ops/safe_pickle.py), so a row written by SQL cannot run code when staff open it.

Schedules come only from code (issue 19, ops/schedules.py): the admin adds none, and shows a
schedule's function, hook and arguments read-only. The worker refuses a task naming anything
else however the row was written (ops/task_guard.py); this keeps the admin from being the way.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet, TextField
from django.db.models.functions import Cast
from django.http import HttpRequest
from django.template.defaultfilters import truncatechars
from django_q import admin as q_admin
from django_q.models import Failure, Schedule, Success
from django_q.tasks import async_task

from ops.models import RefusedTask
from ops.safe_pickle import Loaded, plain_loads

PICKLED_FIELDS = ("args", "kwargs", "result")  # unsigned pickles in django_q_task


def _stored(obj: Any, field: str) -> Loaded:
    """A task row's pickled column, read as plain data from its stored text (annotated by
    `get_queryset`), never through django-picklefield's unrestricted unpickling."""
    return plain_loads(getattr(obj, f"stored_{field}", None))


@admin.action(description="Resubmit selected tasks to queue", permissions=["change"])
def resubmit_task(model_admin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    """django-q2's action, reading args and kwargs as plain data: a row whose arguments are
    not is left alone and named. The task guard still checks the function at enqueue."""
    for task in queryset:
        args, kwargs = _stored(task, "args"), _stored(task, "kwargs")
        if not (args.ok and kwargs.ok):
            model_admin.message_user(
                request,
                f"{task.name} not resubmitted: its arguments are {args.why or kwargs.why}",
                messages.ERROR,
            )
            continue
        async_task(
            task.func,
            *(args.value or ()),
            hook=task.hook,
            group=task.group,
            cluster=task.cluster,
            **(kwargs.value or {}),
        )
        if isinstance(model_admin, FailAdmin):
            task.delete()


class _SafeTaskAdminMixin:
    """Shows a task's args, kwargs and result without unpickling anything but plain data."""

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return (
            super()
            .get_queryset(request)
            .defer(*PICKLED_FIELDS)
            .annotate(**{f"stored_{f}": Cast(f, output_field=TextField()) for f in PICKLED_FIELDS})
        )

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        names = super().get_readonly_fields(request, obj)
        return [f"{name}_shown" if name in PICKLED_FIELDS else name for name in names]

    @admin.display(description="args")
    def args_shown(self, obj: Any) -> str:
        return _stored(obj, "args").shown()

    @admin.display(description="kwargs")
    def kwargs_shown(self, obj: Any) -> str:
        return _stored(obj, "kwargs").shown()

    @admin.display(description="result")
    def result_shown(self, obj: Any) -> str:
        return _stored(obj, "result").shown()


class TaskAdmin(_SafeTaskAdminMixin, q_admin.TaskAdmin):
    actions = [resubmit_task]


class FailAdmin(_SafeTaskAdminMixin, q_admin.FailAdmin):
    actions = [resubmit_task]

    @admin.display(description="Short result")
    def short_result(self, obj: Any) -> str:
        return truncatechars(_stored(obj, "result").shown(), 100)


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
