"""django-q2's task admin, with its one writing action behind the change permission.

django-q2 registers "Resubmit selected tasks to queue" on successful and failed tasks without
`allowed_permissions`, so a view-only staff user could run tasks again (and delete failed
ones). Every admin action that writes declares the permission it needs (issue 10); this
module re-registers the two admins with a guarded copy of the action. `ops` comes before
`django_q` in INSTALLED_APPS, so django-q2's admin module is imported here first.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django_q import admin as q_admin
from django_q.models import Failure, Success


@admin.action(description="Resubmit selected tasks to queue", permissions=["change"])
def resubmit_task(model_admin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    q_admin.resubmit_task(model_admin, request, queryset)


class TaskAdmin(q_admin.TaskAdmin):
    actions = [resubmit_task]


class FailAdmin(q_admin.FailAdmin):
    actions = [resubmit_task]


for _model, _admin_class in ((Success, TaskAdmin), (Failure, FailAdmin)):
    if admin.site.is_registered(_model):
        admin.site.unregister(_model)
    admin.site.register(_model, _admin_class)
