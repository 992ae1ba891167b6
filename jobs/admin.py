"""Jobs in the admin: read-only rows, per-status counts, and two actions that call services.

Nobody edits a job by hand; an operator retries or cancels, and each action is one
queryset-level UPDATE, so "select all 12,000 failed jobs → retry now" is one statement.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models.functions import Substr
from django.utils.html import format_html

from jobs import registry, services
from jobs.models import Job
from jobs.selectors import job_status_counts, jobs_due, jobs_stuck
from project.admin import SelectorFilter


class KindFilter(admin.SimpleListFilter):
    """Choices from the handler registry, not a SELECT DISTINCT over a table of millions."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request, model_admin):
        return [(kind, kind) for kind in registry.registered_kinds()]

    def queryset(self, request, queryset):
        return queryset.filter(kind=self.value()) if self.value() else queryset


class JobHealthFilter(SelectorFilter):
    choices_by_value = {
        "stuck": ("Stuck past their lease", lambda now: jobs_stuck(now=now)),
        "due": ("Due now", lambda now: jobs_due(now=now)),
    }


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "kind",
        "status",
        "priority",
        "attempts_display",
        "run_after",
        "created_at",
        "completed_at",
        "failed_at",
        "error_summary",
    )
    list_filter = ("status", KindFilter, JobHealthFilter)
    search_fields = ("kind",)  # plus an exact id, see get_search_results
    search_help_text = "A job id (e.g. 42 or #42), or part of a kind."
    ordering = ("-id",)
    list_per_page = 100
    show_full_result_count = False  # no second COUNT(*) over a large table
    actions = ("retry_now", "cancel")
    fields = [field.name for field in Job._meta.fields if field.name != "last_error"] + [
        "error_details"
    ]
    readonly_fields = fields
    change_list_template = "admin/jobs/job/change_list.html"

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # completed rows are pruned by the schedule; others are evidence

    def has_change_permission(self, request, obj=None) -> bool:
        # The list (and its actions) need "change"; a single row is only ever viewed.
        return obj is None and super().has_change_permission(request)

    def get_queryset(self, request):
        # Payloads and tracebacks can be megabytes: the list reads only the error's first
        # 200 characters (for its summary); a job's own page loads the rest when shown.
        return (
            super()
            .get_queryset(request)
            .defer("payload", "last_error")
            .annotate(error_head=Substr("last_error", 1, 200))
        )

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip().lstrip("#")
        if term.isdigit():
            return queryset.filter(pk=int(term)), False
        return super().get_search_results(request, queryset, search_term)

    def changelist_view(self, request, extra_context=None):
        counts = job_status_counts()
        extra_context = {
            **(extra_context or {}),
            "status_counts": [(value, label, counts[value]) for value, label in Job.Status.choices],
        }
        return super().changelist_view(request, extra_context=extra_context)

    @admin.display(description="attempts")
    def attempts_display(self, job: Job) -> str:
        return f"{job.attempts}/{job.max_attempts}"

    @admin.display(description="last error")
    def error_summary(self, job: Job) -> str:
        first = job.error_head.split("\n", 1)[0]
        return first if len(first) <= 120 else first[:117] + "..."

    @admin.display(description="last error")
    def error_details(self, job: Job) -> str:
        if not job.last_error:
            return "-"
        return format_html(
            '<pre style="white-space: pre-wrap; max-height: 40em; overflow: auto">{}</pre>',
            job.last_error,
        )

    @admin.action(
        description="Retry now (queued, failed or cancelled jobs)", permissions=["change"]
    )
    def retry_now(self, request, queryset):
        count = services.jobs_retry_now(jobs=queryset)
        self.message_user(request, f"{count} job(s) queued to run now.", messages.SUCCESS)

    @admin.action(description="Cancel (queued or failed jobs)", permissions=["change"])
    def cancel(self, request, queryset):
        count = services.jobs_cancel(jobs=queryset)
        self.message_user(request, f"{count} job(s) cancelled.", messages.SUCCESS)
