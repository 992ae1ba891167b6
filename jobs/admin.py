"""Jobs in the admin: read-only rows, per-status counts, and two actions that call services.

Nobody edits a job by hand; an operator retries or cancels, and each action is one
queryset-level UPDATE, so "select all 12,000 failed jobs → retry now" is one statement.
Cancel asks first (issue 36.8), as Django's "Delete selected" does: the job's button, the
list's action and an error group's "Cancel all" each show what they will cancel and act
once that page's form comes back confirmed.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now, Substr
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from jobs import registry, services
from jobs.error_groups import (
    ErrorGroup,
    GroupActed,
    error_group_cancel,
    error_group_name,
    error_group_retry,
    error_group_url,
    job_error_group,
    job_error_groups,
    jobs_in_error_group,
)
from jobs.models import Job, JobAttempt, PausedKind
from jobs.reaper import job_reap
from jobs.selectors import job_status_counts, jobs_due, jobs_stuck
from project.admin import LIST_COUNT_CAP, CappedCountPaginator, SelectorFilter

CANCELLABLE = (Job.Status.QUEUED, Job.Status.FAILED)  # what services.jobs_cancel takes
CANCEL_LISTED = 100  # jobs named on the cancel confirmation page; the rest are counted


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
        "held_by",
        "error_summary",
    )
    list_filter = ("status", KindFilter, JobHealthFilter, ErrorGroupFilter)
    search_fields = ("kind",)  # plus an exact id, see get_search_results
    search_help_text = "A job id (e.g. 42 or #42), or part of a kind."
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
            .defer("payload", "last_error")
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

    def error_groups_view(self, request: HttpRequest) -> TemplateResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        groups = [(group, error_group_url(group.key)) for group in job_error_groups()]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Failed jobs by error",
            "groups": groups,
            "can_retry": self._may_act(request),
        }
        return TemplateResponse(request, "admin/jobs/job/error_groups.html", context)

    def retry_group_view(self, request: HttpRequest, key: str) -> HttpResponseRedirect:
        """Retry every failed job of one group: one UPDATE, one entry in the admin's log."""
        if not self._may_act(request):
            raise PermissionDenied
        acted = error_group_retry(key=key)
        return self._group_done(request, key, acted, "retried", "queued to run now")

    def cancel_group_view(self, request: HttpRequest, key: str) -> HttpResponse:
        """ "Cancel all" of one group: a confirmation page naming the group first; the cancel
        itself (one UPDATE, one entry in the admin's log) once it comes back confirmed."""
        if not self._may_act(request):
            raise PermissionDenied
        if request.POST.get("confirm") == "yes":
            acted = error_group_cancel(key=key)
            return self._group_done(request, key, acted, "cancelled", "cancelled")
        group = job_error_group(key=key)
        if group is None:
            self.message_user(request, "No failed job left in that group.", messages.WARNING)
            return HttpResponseRedirect(reverse("admin:jobs_job_error_groups"))
        return self._cancel_confirmation(
            request,
            jobs_in_error_group(key),
            group=group,
            hidden=[("confirm", "yes")],
            back_url=reverse("admin:jobs_job_error_groups"),
        )

    def _group_done(
        self, request: HttpRequest, key: str, acted: GroupActed, verb: str, done: str
    ) -> HttpResponseRedirect:
        if acted.first is not None:
            self.log_change(request, acted.first, f"{verb} error group {key}: {acted.count} job(s)")
        self.message_user(request, f"{acted.count} job(s) of the group {done}.")
        return HttpResponseRedirect(reverse("admin:jobs_job_error_groups"))

    def _cancel_confirmation(
        self,
        request: HttpRequest,
        jobs,
        *,
        hidden: list[tuple[str, object]],
        back_url: str,
        one: Job | None = None,
        group: ErrorGroup | None = None,
    ) -> TemplateResponse:
        """What Cancel will cancel (the queued or failed ones of `jobs`: the others it leaves
        alone), and a form that repeats the request confirmed."""
        cancellable = jobs.filter(status__in=CANCELLABLE).order_by()
        count = cancellable[: LIST_COUNT_CAP + 1].count()  # no COUNT(*) over a million rows
        shown = list(
            cancellable.defer("payload", "last_error")
            .annotate(error_head=Substr("last_error", 1, 200))
            .order_by("pk")[:CANCEL_LISTED]
        )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": (
                f"Cancel job #{one.pk}: are you sure?"
                if one is not None
                else "Cancel jobs: are you sure?"
            ),
            "count": count,
            "count_capped": count > LIST_COUNT_CAP,
            "shown": [(job, self.error_summary(job)) for job in shown],
            "more": max(count - len(shown), 0),
            "one": one,
            "group": group,
            "hidden": hidden,
            "form_action": request.get_full_path(),
            "back_url": back_url,
        }
        return TemplateResponse(request, "admin/jobs/job/cancel_confirmation.html", context)

    def _may_act(self, request: HttpRequest) -> bool:
        return super().has_change_permission(request)  # the model's change permission

    def _act(
        self, request: HttpRequest, job_id: int, message: str, done: int
    ) -> HttpResponseRedirect:
        if not self._may_act(request):
            raise PermissionDenied
        job = get_object_or_404(Job, pk=job_id)
        if done:
            self.log_change(request, job, message)
            self.message_user(request, f"Job #{job_id}: {message}.", messages.SUCCESS)
        else:
            self.message_user(
                request, f"Job #{job_id} is {job.status}: nothing done.", messages.WARNING
            )
        return HttpResponseRedirect(reverse("admin:jobs_job_change", args=[job_id]))

    def retry_view(self, request: HttpRequest, job_id: int) -> HttpResponseRedirect:
        if not self._may_act(request):
            raise PermissionDenied
        count = services.jobs_retry_now(jobs=Job.objects.filter(pk=job_id))
        return self._act(request, job_id, "queued to run now", count)

    def cancel_view(self, request: HttpRequest, job_id: int) -> HttpResponse:
        """The job page's Cancel: a confirmation page first (unless the job is past
        cancelling: then it says so at once); the cancel once it comes back confirmed."""
        if not self._may_act(request):
            raise PermissionDenied
        jobs = Job.objects.filter(pk=job_id)
        job = get_object_or_404(jobs.only("pk", "status"))
        if request.POST.get("confirm") != "yes" and job.status in CANCELLABLE:
            return self._cancel_confirmation(
                request,
                jobs,
                one=job,
                hidden=[("confirm", "yes")],
                back_url=reverse("admin:jobs_job_change", args=[job_id]),
            )
        count = services.jobs_cancel(jobs=jobs)
        return self._act(request, job_id, "cancelled", count)

    def reap_view(self, request: HttpRequest, job_id: int) -> HttpResponseRedirect:
        if not self._may_act(request):
            raise PermissionDenied
        reaped = job_reap(job_id=job_id)
        status = f"reaped ({reaped.status})" if reaped else ""
        return self._act(request, job_id, status, 1 if reaped else 0)

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
        count = services.jobs_retry_now(jobs=queryset)
        self.message_user(request, f"{count} job(s) queued to run now.", messages.SUCCESS)

    @admin.action(description="Cancel (queued or failed jobs)", permissions=["change"])
    def cancel(self, request, queryset) -> TemplateResponse | None:
        """Asks first, as Django's "Delete selected" does; cancels once the page's form
        comes back with `post=yes`. The form repeats the selection as it came (the list's
        filters in its address, "select all" as select_across), not thousands of ids."""
        if request.POST.get("post") == "yes":
            count = services.jobs_cancel(jobs=queryset)
            self.message_user(request, f"{count} job(s) cancelled.", messages.SUCCESS)
            return None
        if not queryset.filter(status__in=CANCELLABLE).exists():
            self.message_user(
                request,
                "None of the selected jobs is queued or failed: nothing to cancel.",
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
