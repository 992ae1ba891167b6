"""The jobs admin's views beyond Django's own (issue 20, 36.8): a job page's Retry now /
Cancel / Reap now, the *Failed jobs by error* page with each group's Retry all / Cancel all,
and the confirmation page every Cancel shows first. A mixin of `JobAdmin` (jobs/admin.py),
which routes the URLs; each view checks the model's change permission, calls a service and
writes the admin's log entry.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models.functions import Substr
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse

from jobs.error_groups import (
    ErrorGroup,
    GroupActed,
    error_group_cancel,
    error_group_retry,
    error_group_url,
    job_error_group,
    job_error_groups,
    jobs_in_error_group,
)
from jobs.models import Job
from jobs.operator_actions import jobs_cancel, jobs_retry_now
from jobs.reaper import job_reap
from project.admin import LIST_COUNT_CAP

# What jobs_cancel takes: a queued or failed job is cancelled at once; a running one's
# worker is asked to stop it, and it ends cancelled once its handler has stopped (issue 37.8).
CANCELLABLE = (Job.Status.QUEUED, Job.Status.FAILED, Job.Status.PROCESSING)
CANCEL_LISTED = 100  # jobs named on the cancel confirmation page; the rest are counted


class JobActionViews:
    """Views of `JobAdmin` (a ModelAdmin: `admin_site`, `model`, `message_user`,
    `log_change` and `error_summary` are its)."""

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
        count = jobs_retry_now(jobs=Job.objects.filter(pk=job_id))
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
        running = job.status == Job.Status.PROCESSING
        count = jobs_cancel(jobs=jobs)
        if running and count:
            what = "asked its worker to stop: it ends cancelled once its handler has stopped"
            return self._act(request, job_id, what, count)
        return self._act(request, job_id, "cancelled", count)

    def reap_view(self, request: HttpRequest, job_id: int) -> HttpResponseRedirect:
        if not self._may_act(request):
            raise PermissionDenied
        reaped = job_reap(job_id=job_id)
        status = f"reaped ({reaped.status})" if reaped else ""
        return self._act(request, job_id, status, 1 if reaped else 0)
