"""Jobs in the admin: read-only rows, per-status counts, and two actions that call
jobs/operator_actions.py.

Nobody edits a job by hand; an operator retries or cancels, and each action is one
queryset-level UPDATE, so "select all 12,000 failed jobs → retry now" is one statement.
Cancel asks first (issue 36.8), as Django's "Delete selected" does: the job's button, the
list's action and an error group's "Cancel all" each show what they will cancel and act
once that page's form comes back confirmed. The views beyond Django's own (a job's buttons,
the error groups' page) are in jobs/admin_views.py.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now, Substr
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from jobs import registry
from jobs.admin_search import TagFilter, UniqueKeyFilter
from jobs.admin_search import search as search_by_name
from jobs.admin_views import CANCELLABLE, JobActionViews
from jobs.error_groups import (
    error_group_name,
    error_group_url,
    jobs_in_error_group,
)
from jobs.models import Job, JobAttempt, KindCap, KindRate, PausedKind
from jobs.operator_actions import jobs_cancel, jobs_retry_now
from jobs.selectors import job_counts_by_kind, job_status_counts, jobs_due, jobs_stuck
from project.admin import CappedCountPaginator, ReadOnlyAdmin, SelectorFilter


class KindFilter(admin.SimpleListFilter):
    """Choices from the handler registry, not a SELECT DISTINCT over a table of millions."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request, model_admin):
        return [(kind, kind) for kind in registry.registered_kinds()]

    def queryset(self, request, queryset):
        return queryset.filter(kind=self.value()) if self.value() else queryset


class ErrorGroupFilter(admin.SimpleListFilter):
    """`?error_group=<key>`: the failed jobs of one error group (linked from its page)."""

    title = "error group"
    parameter_name = "error_group"

    def lookups(self, request, model_admin):
        value = self.value()
        return [(value, f"group {value[:8]}")] if value else []

    def queryset(self, request, queryset):
        value = self.value() or ""
        if not value:
            return queryset
        return queryset.filter(pk__in=jobs_in_error_group(value).values("pk"))


class JobHealthFilter(SelectorFilter):
    choices_by_value = {
        "stuck": ("Stuck past their lease", lambda now: jobs_stuck(now=now)),
        "due": ("Due now", lambda now: jobs_due(now=now)),
    }


@admin.register(Job)
class JobAdmin(JobActionViews, admin.ModelAdmin):
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
        "held_by",
        "error_summary",
        "key_and_tags",
    )
    list_filter = (
        "status",
        KindFilter,
        JobHealthFilter,
        ErrorGroupFilter,
        TagFilter,
        UniqueKeyFilter,
    )
    search_fields = ("kind",)  # plus an exact id and name=value, see get_search_results
    search_help_text = (
        "A job id (e.g. 42 or #42), part of a kind, tag=slack, key=<unique key>, or an exact "
        "meta value: proposal=812."
    )
    ordering = ("-id",)
    list_per_page = 50  # rendering 100 rows cost more than every query of the page
    paginator = CappedCountPaginator  # no COUNT(*) over a million rows
    show_full_result_count = False  # no second COUNT(*) over a large table
    actions = ("retry_now", "cancel")
    # The error group's md5 is shown as a link to the group's jobs (issue 31.6).
    fields = [
        "error_group_link" if field.name == "error_group" else field.name
        for field in Job._meta.fields
        if field.name != "last_error"
    ] + ["error_details"]
    readonly_fields = fields
    change_list_template = "admin/jobs/job/change_list.html"
    change_form_template = "admin/jobs/job/change_form.html"

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
            .defer("payload", "last_error", "meta")
            .annotate(
                error_head=Substr("last_error", 1, 200),
                # Judged by the database's clock (issue 22): this host's may be minutes off.
                lease_expired=ExpressionWrapper(
                    Q(lease_expires_at__lt=Now()), output_field=BooleanField()
                ),
            )
        )

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip().lstrip("#")
        if term.isdigit():
            return queryset.filter(pk=int(term)), False
        found = search_by_name(queryset, search_term.strip())
        if found is not None:
            return found, False
        return super().get_search_results(request, queryset, search_term)

    def changelist_view(self, request, extra_context=None):
        counts = job_status_counts()
        extra_context = {
            **(extra_context or {}),
            "status_counts": [(value, label, counts[value]) for value, label in Job.Status.choices],
        }
        return super().changelist_view(request, extra_context=extra_context)

    # --- the detail page: attempt history and the actions at hand (issue 20) ----------------

    def get_urls(self):
        def view(action):
            return self.admin_site.admin_view(require_POST(getattr(self, f"{action}_view")))

        return [
            path(
                "error-groups/",
                self.admin_site.admin_view(self.error_groups_view),
                name="jobs_job_error_groups",
            ),
            path(
                "error-groups/<str:key>/retry/",
                view("retry_group"),
                name="jobs_job_error_group_retry",
            ),
            path(
                "error-groups/<str:key>/cancel/",
                view("cancel_group"),
                name="jobs_job_error_group_cancel",
            ),
            path("<int:job_id>/retry/", view("retry"), name="jobs_job_retry"),
            path("<int:job_id>/cancel/", view("cancel"), name="jobs_job_cancel"),
            path("<int:job_id>/reap/", view("reap"), name="jobs_job_reap"),
            *super().get_urls(),
        ]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        job = self.get_object(request, object_id)
        extra = dict(extra_context or {})
        if job is not None:
            stuck = job.status == Job.Status.PROCESSING and bool(job.lease_expired)
            can_act = self._may_act(request)
            extra.update(
                attempts=JobAttempt.objects.filter(job_id=job.pk).order_by("number", "id"),
                stuck=stuck,
                paused=PausedKind.objects.filter(kind=job.kind).first(),
                can_retry=can_act
                and job.status in (Job.Status.QUEUED, Job.Status.FAILED, Job.Status.CANCELLED),
                can_cancel=can_act and job.status in CANCELLABLE,
                can_reap=can_act and stuck,
            )
        return super().change_view(request, object_id, form_url, extra_context=extra)

    @admin.display(description="held by")
    def held_by(self, job: Job) -> str:
        """For a running job: the worker run holding it and its lease expiry (a stuck job's
        holder is the process that died)."""
        if job.status != Job.Status.PROCESSING:
            return ""
        expires = job.lease_expires_at
        if expires is None:
            return job.locked_by
        state = "expired" if job.lease_expired else "until"
        return f"{job.locked_by}, lease {state} {expires:%H:%M:%S}"

    @admin.display(description="key, tags")
    def key_and_tags(self, job: Job) -> str:
        """The unique key and the tags in one narrow column (the list fits 1,366 px), each
        cut to its first 24 characters; the job's page shows them whole."""
        parts = [job.unique_key or "", *(f"#{tag}" for tag in job.tags or ())]
        return " ".join(part if len(part) <= 24 else part[:23] + "…" for part in parts if part)

    @admin.display(description="attempts")
    def attempts_display(self, job: Job) -> str:
        return f"{job.attempts}/{job.max_attempts}"

    @admin.display(description="last error")
    def error_summary(self, job: Job) -> str:
        first = job.error_head.split("\n", 1)[0]
        return first if len(first) <= 120 else first[:117] + "..."

    @admin.display(description="error group")
    def error_group_link(self, job: Job) -> str:
        """The group's jobs, named by the group's class and normalised message (as "Failed
        jobs by error" lists it), rather than the md5 that keys it."""
        if not job.error_group:
            return "-"
        exception, message = error_group_name(last_error=job.last_error)
        count = jobs_in_error_group(job.error_group).count()
        return format_html(
            '<a href="{}">{}: {}</a> ({} failed job(s) in the group; all groups: '
            '<a href="{}">Failed jobs by error</a>)',
            error_group_url(job.error_group),
            exception,
            message,
            count,
            reverse("admin:jobs_job_error_groups"),
        )

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
        count = jobs_retry_now(jobs=queryset)
        self.message_user(request, f"{count} job(s) queued to run now.", messages.SUCCESS)

    @admin.action(
        description="Cancel (queued or failed jobs; running ones are asked to stop)",
        permissions=["change"],
    )
    def cancel(self, request, queryset) -> TemplateResponse | None:
        """Asks first, as Django's "Delete selected" does; cancels once the page's form
        comes back with `post=yes`. The form repeats the selection as it came (the list's
        filters in its address, "select all" as select_across), not thousands of ids."""
        if request.POST.get("post") == "yes":
            running = queryset.filter(status=Job.Status.PROCESSING).count()
            count = jobs_cancel(jobs=queryset)
            asked = min(running, count)
            message = f"{count - asked} job(s) cancelled."
            if asked:  # issue 37, point 8
                message += (
                    f" {asked} running job(s) asked to stop: each ends cancelled once its "
                    "handler has stopped."
                )
            self.message_user(request, message, messages.SUCCESS)
            return None
        if not queryset.filter(status__in=CANCELLABLE).exists():
            self.message_user(
                request,
                "None of the selected jobs is queued, failed or running: nothing to cancel.",
                messages.WARNING,
            )
            return None
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        return self._cancel_confirmation(
            request,
            queryset,
            hidden=[
                *((helpers.ACTION_CHECKBOX_NAME, pk) for pk in selected),
                ("select_across", request.POST.get("select_across", "0")),
                ("index", request.POST.get("index", "0")),
                ("action", "cancel"),
                ("post", "yes"),
            ],
            back_url=request.get_full_path(),
        )


@admin.register(PausedKind)
class PausedKindAdmin(admin.ModelAdmin):
    """Pausing a kind is adding it here; resuming is deleting it. The claim skips paused
    kinds, so their jobs wait in the queue; each change is in the admin's log."""

    list_display = ("kind", "paused_at", "paused_by", "note", "queued")
    fields = ("kind", "note")

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        if obj is None:
            kinds = registry.registered_kinds()
            form.base_fields["kind"] = forms.ChoiceField(
                choices=[(k, k) for k in kinds], help_text="A job kind registered in code."
            )
        return form

    def get_readonly_fields(self, request, obj=None):
        return ("kind",) if obj is not None else ()

    def save_model(self, request, obj, form, change):
        if not change:
            obj.paused_by = request.user.get_username()[:150]
        super().save_model(request, obj, form, change)

    @admin.display(description="queued jobs waiting")
    def queued(self, obj: PausedKind) -> int:
        return Job.objects.filter(kind=obj.kind, status=Job.Status.QUEUED).count()


@admin.register(KindCap)
class KindCapAdmin(ReadOnlyAdmin):
    """The caps per kind for the whole deployment (issue 37, point 2), as the workers wrote
    them from `@handler(kind, concurrency=N)` at start-up: read-only, since code is the source
    (a row changed here would be put back by the next worker's start). Beside each cap, the
    units in use now and the jobs waiting."""

    list_display = ("kind", "concurrency", "running", "queued", "updated_at")
    fields = ("kind", "concurrency", "updated_at")

    @admin.display(description="running now")
    def running(self, obj: KindCap) -> int:
        # its processing rows, on jobs_job_running_kind_idx (at most about its cap)
        return Job.objects.filter(kind=obj.kind, status=Job.Status.PROCESSING).count()

    @admin.display(description="queued")
    def queued(self, obj: KindCap) -> int:
        # the trigger-kept counts (a few rows a capped kind): no count over its backlog
        return job_counts_by_kind().get(obj.kind, {}).get(Job.Status.QUEUED, 0)


@admin.register(KindRate)
class KindRateAdmin(ReadOnlyAdmin):
    """The rates per kind for the whole deployment (issue 38, point 3), as the workers wrote
    them from `@handler(kind, rate="20/s")` at start-up: read-only, since code is the source.
    Each row is also the kind's token bucket: its next token's time, and the jobs waiting."""

    list_display = ("kind", "rate_shown", "next_slot_at", "queued", "updated_at")
    fields = ("kind", "rate", "interval_seconds", "next_slot_at", "floor_at", "updated_at")

    @admin.display(description="rate", ordering="rate")
    def rate_shown(self, obj: KindRate) -> str:
        # At 390 px the column shrank to "20/s" beside two-line dates: kept 4.5 em wide
        return format_html(
            '<span style="display: inline-block; min-width: 4.5em; white-space: nowrap">{}</span>',
            obj.rate,
        )

    @admin.display(description="queued")
    def queued(self, obj: KindRate) -> int:
        # the trigger-kept counts: no count over its backlog
        return job_counts_by_kind().get(obj.kind, {}).get(Job.Status.QUEUED, 0)
