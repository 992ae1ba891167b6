"""Admin: read-only ledger and replies; quarantined mail shown as escaped text; actions call
services. Mail is never rendered as HTML and never fetches remote content."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_POST

from inbound_email.exceptions import InboundEmailError
from inbound_email.models import InboundEmail, Reply, ReplyAttachment
from inbound_email.parsing import parse_header_text, raw_preview
from inbound_email.selectors import (
    inbound_email_raw_kept_bytes,
    inbound_relays_stuck,
    replies_needing_operator,
)
from inbound_email.services.actions import (
    attachment_content,
    inbound_email_discard,
    inbound_email_raw,
    inbound_email_reprocess,
    reply_acknowledge,
)
from project.admin import CappedCountPaginator, ReadOnlyAdmin, SelectorFilter

DISCARD_LISTED = 100  # mails named on the discard confirmation page; the rest are counted
SUMMARY_RAW_BYTES = 256 * 1024  # of a stored mail read for its summary: its header block


def _pre(text: str) -> str:
    # format_html escapes: a <script> or <img src=http://...> in mail is shown, never run.
    return format_html('<pre style="white-space: pre-wrap; max-height: 40em">{}</pre>', text)


class InboundEmailHealthFilter(SelectorFilter):
    choices_by_value = {
        "relay_stuck": ("Relay stuck over 24 h", lambda now: inbound_relays_stuck(now=now)),
    }


class ReplyHealthFilter(SelectorFilter):
    choices_by_value = {
        "needs_operator": ("Needs an operator", lambda now: replies_needing_operator()),
    }


@admin.register(InboundEmail)
class InboundEmailAdmin(ReadOnlyAdmin):
    list_display = ("id", "store_key", "status", "reason", "attempts", "subject", "created_at")
    list_filter = ("status", "reason", InboundEmailHealthFilter)
    search_fields = ("store_key", "message_id", "subject")
    date_hierarchy = "created_at"
    actions = ("reprocess", "discard")
    change_form_template = "admin/inbound_email/inboundemail/change_form.html"
    paginator = CappedCountPaginator  # no COUNT(*) over every mail (issue 20)
    list_per_page = 50
    show_full_result_count = False
    fieldsets = (
        (None, {"fields": ("store_key", "status", "reason", "detail", "attempts")}),
        ("Mail", {"fields": ("message_id", "from_address", "to_addresses", "subject", "sent_at")}),
        ("Content (escaped text, never rendered)", {"fields": ("headers_view", "body_view")}),
        ("Raw source", {"fields": ("raw_link", "size", "sha256", "etag")}),
        (
            "Processing",
            {
                "fields": (
                    "notification",
                    "rejection_notice",
                    "duplicate_of",
                    "next_attempt_at",
                    "quarantine_key",
                    "intake_deleted",
                    "error_view",
                    "created_at",
                    "updated_at",
                    "finished_at",
                )
            },
        ),
    )
    # Every field shown is read-only: rows change only through the actions below.
    readonly_fields = tuple(name for _, section in fieldsets for name in section["fields"])

    def get_queryset(self, request: HttpRequest):
        # The raw source is read only by the download view; the decoded bodies and the last
        # error (large) only by a mail's own page, which loads them when shown (issue 22).
        return super().get_queryset(request).defer("raw", "body_text", "headers_text", "last_error")

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Reprocess / discard change state: they need the model's change permission."""
        return request.user.has_perm("inbound_email.change_inboundemail")

    @admin.display(description="Headers")
    def headers_view(self, obj: InboundEmail) -> str:
        return _pre(obj.headers_text or "(not read)")

    @admin.display(description="Decoded text")
    def body_view(self, obj: InboundEmail) -> str:
        return _pre(obj.body_text or "(empty or not read)")

    @admin.display(description="Last error")
    def error_view(self, obj: InboundEmail) -> str:
        # Folded: the reason above says what happened in words; the traceback is for a
        # developer (issue 20).
        if not obj.last_error:
            return "—"
        first = obj.last_error.strip().splitlines()[-1][:200] if obj.last_error.strip() else ""
        return format_html(
            '<details class="traceback"><summary>{}</summary>'
            '<pre style="white-space: pre-wrap; max-height: 40em">{}</pre></details>',
            first or "traceback",
            obj.last_error,
        )

    @admin.display(description="Raw source")
    def raw_link(self, obj: InboundEmail) -> str:
        url = reverse("admin:inbound_email_inboundemail_raw", args=[obj.pk])
        kept = inbound_email_raw_kept_bytes(inbound_email_id=obj.pk)
        if kept is not None and kept < obj.size:  # rejected mail keeps its first bytes only
            return format_html(
                '<a href="{}">Download .eml</a> (only the first {} of {} bytes were kept)',
                url,
                kept,
                obj.size,
            )
        return format_html('<a href="{}">Download .eml</a>', url)

    def get_urls(self):
        raw = path(
            "<int:pk>/raw/",
            self.admin_site.admin_view(self.raw_view),
            name="inbound_email_inboundemail_raw",
        )
        one = [
            path(
                f"<int:pk>/{verb}/",
                self.admin_site.admin_view(require_POST(getattr(self, f"{verb}_view"))),
                name=f"inbound_email_inboundemail_{verb}",
            )
            for verb in ("reprocess", "discard")
        ]
        return [raw, *one, *super().get_urls()]

    # --- the detail page of a settled (quarantined / rejected) mail (issue 20) ------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        obj = self.get_object(request, object_id)
        extra = dict(extra_context or {})
        if obj is not None:
            settled = obj.status in (InboundEmail.Status.QUARANTINED, InboundEmail.Status.REJECTED)
            extra.update(
                mail_summary=self._summary(obj),
                reason_words=self._reason_words(obj),
                can_operate=settled and self.has_operate_permission(request),
            )
        return super().change_view(request, object_id, form_url, extra_context=extra)

    @staticmethod
    def _reason_words(obj: InboundEmail) -> str:
        status = obj.get_status_display()
        if not obj.reason:
            return status
        return f"{status}: {obj.get_reason_display()}"

    @staticmethod
    def _summary(obj: InboundEmail) -> dict[str, str]:
        """From, To, Subject and Date: from the row when the mail was parsed, else from the
        headers the page shows below (a quarantined mail often never got that far: stopped
        by a header limit, its header fields are read here without the intake's limits,
        from that bounded text), else from the start of its stored raw. "Could not be read"
        only when there was nothing to read (issue 36.8). Plain text; the template escapes."""
        summary = {
            "from": obj.from_address,
            "to": obj.to_addresses,
            "subject": obj.subject,
            "date": f"{obj.sent_at:%Y-%m-%d %H:%M:%S} UTC" if obj.sent_at else "",
            "source": "the ledger row",
            "problem": "",
        }
        if summary["from"] and summary["subject"]:
            return summary
        text, source = obj.headers_text, "the headers shown below"
        if not text:
            try:  # `raw` is deferred in the admin's queryset: this loads it, for this row only
                raw = inbound_email_raw(inbound_email=obj)
            except InboundEmailError as exc:  # the store unreachable, or the copy gone
                summary["problem"] = f"the stored mail could not be read: {exc}"
                return summary
            text, _ = raw_preview(raw[:SUMMARY_RAW_BYTES])
            source = "the stored raw mail"
        parsed = parse_header_text(text)
        summary.update(
            {
                "from": parsed.from_address or parsed.header("From"),
                "to": ", ".join(parsed.recipients) or parsed.header("To"),
                "subject": parsed.subject,
                "date": f"{parsed.date:%Y-%m-%d %H:%M:%S %Z}".strip() if parsed.date else "",
                "source": source,
            }
        )
        return summary

    def _one(self, request: HttpRequest, pk: int, service, verb: str) -> HttpResponseRedirect:
        if not self.has_operate_permission(request):
            raise PermissionDenied
        obj = get_object_or_404(InboundEmail.objects.defer("raw"), pk=pk)
        try:
            service(inbound_email_id=pk)
        except InboundEmailError as exc:
            self.message_user(request, f"#{pk}: {exc}", messages.WARNING)
        else:
            self.log_change(request, obj, verb)
            self.message_user(request, f"Mail #{pk} {verb}.", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:inbound_email_inboundemail_change", args=[pk]))

    def reprocess_view(self, request: HttpRequest, pk: int) -> HttpResponseRedirect:
        return self._one(request, pk, inbound_email_reprocess, "queued for reprocessing")

    def discard_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """The Discard button: a confirmation page first; the discard itself once that page's
        form comes back with `confirm=yes`."""
        if request.POST.get("confirm") == "yes":
            return self._one(request, pk, inbound_email_discard, "discarded")
        if not self.has_operate_permission(request):
            raise PermissionDenied
        mail = get_object_or_404(InboundEmail.objects.defer("raw"), pk=pk)
        return self._discard_confirmation(
            request,
            [mail],
            one=mail,
            hidden=[("confirm", "yes")],
            back_url=reverse("admin:inbound_email_inboundemail_change", args=[pk]),
        )

    def _discard_confirmation(
        self, request: HttpRequest, mails: list[InboundEmail], **context: Any
    ) -> TemplateResponse:
        """What Discard will delete, and a form that repeats the request confirmed."""
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Discard mail: are you sure?",
            "mails": mails,
            "shown": mails[:DISCARD_LISTED],
            "more": max(len(mails) - DISCARD_LISTED, 0),
            "form_action": request.get_full_path(),
            "one": None,
            **context,
        }
        return TemplateResponse(
            request, "admin/inbound_email/inboundemail/discard_confirmation.html", context
        )

    def raw_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        if not self.has_view_permission(request):
            return HttpResponse(status=403)
        obj = get_object_or_404(InboundEmail, pk=pk)
        try:
            data = inbound_email_raw(inbound_email=obj)
        except InboundEmailError as exc:
            return HttpResponse(
                f"raw source unavailable: {exc}", status=404, content_type="text/plain"
            )
        # octet-stream + attachment + nosniff: the browser saves it, never renders it.
        response = HttpResponse(data, content_type="application/octet-stream")
        response["Content-Disposition"] = f'attachment; filename="inbound-{obj.pk}.eml"'
        response["X-Content-Type-Options"] = "nosniff"
        return response

    def _run(self, request: HttpRequest, queryset, service, verb: str) -> None:
        done, failed = 0, []
        for obj in queryset.only("id"):
            try:
                service(inbound_email_id=obj.pk)
                done += 1
            except InboundEmailError as exc:
                failed.append(f"#{obj.pk}: {exc}")
        if done:
            self.message_user(request, f"{done} mail(s) {verb}.", messages.SUCCESS)
        for line in failed:
            self.message_user(request, line, messages.WARNING)

    @admin.action(
        description="Reprocess (put back in the intake, fresh attempts)",
        permissions=["operate"],
    )
    def reprocess(self, request: HttpRequest, queryset) -> None:
        self._run(request, queryset, inbound_email_reprocess, "queued for reprocessing")

    @admin.action(description="Discard (delete stored copies for good)", permissions=["operate"])
    def discard(self, request: HttpRequest, queryset) -> TemplateResponse | None:
        """Asks first, as Django's "Delete selected" does: the selected mails are listed and
        discarded only when the page's form comes back with `post=yes`."""
        if request.POST.get("post") == "yes":
            self._run(request, queryset, inbound_email_discard, "discarded")
            return None
        mails = list(queryset.only("id", "store_key", "status", "reason", "subject").order_by("pk"))
        return self._discard_confirmation(
            request,
            mails,
            hidden=[
                *((helpers.ACTION_CHECKBOX_NAME, mail.pk) for mail in mails),
                ("action", "discard"),
                ("post", "yes"),
            ],
            back_url=reverse("admin:inbound_email_inboundemail_changelist"),
        )


@admin.register(Reply)
class ReplyAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "notification",
        "rating",
        "relay_status",
        "relay_attempts",
        "needs_operator_text",
        "operator_acknowledged_at",
        "created_at",
    )
    list_filter = (
        "relay_status",
        "needs_operator",
        ("operator_acknowledged_at", admin.EmptyFieldListFilter),
        ReplyHealthFilter,
    )
    readonly_fields = [f.name for f in Reply._meta.fields]
    actions = ("acknowledge",)

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Acknowledging changes state: it needs the model's change permission."""
        return request.user.has_perm("inbound_email.change_reply")

    @admin.display(description="needs operator", ordering="needs_operator")
    def needs_operator_text(self, obj: Reply) -> str:
        """Plain "yes"/"no": the admin's boolean icons draw a red cross for False, and a reply
        that needs no operator is the normal case, not an error (issue 20)."""
        return "yes" if obj.needs_operator else "no"

    @admin.action(description="Acknowledge (handled by an operator)", permissions=["operate"])
    def acknowledge(self, request: HttpRequest, queryset) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        done = reply_acknowledge(reply_ids=ids)
        self.message_user(request, f"{done} reply(ies) acknowledged.", messages.SUCCESS)
        if done < len(ids):
            self.message_user(
                request,
                f"{len(ids) - done} reply(ies) skipped: they need no operator or were "
                "already acknowledged.",
                messages.WARNING,
            )


@admin.register(ReplyAttachment)
class ReplyAttachmentAdmin(ReadOnlyAdmin):
    """Attachments of accepted replies (issue 21); the database inbox links each stored one
    to its download here. The file is always saved, never shown: a sender's HTML or SVG must
    not run in the admin's origin."""

    list_display = ("id", "reply", "index", "filename", "content_type", "size", "state")
    list_filter = ("state",)
    search_fields = ("filename", "sha256")
    readonly_fields = [*(f.name for f in ReplyAttachment._meta.fields), "download_link"]

    @admin.display(description="Download")
    def download_link(self, obj: ReplyAttachment) -> str:
        if obj.state != ReplyAttachment.State.STORED:
            url = reverse("admin:inbound_email_inboundemail_raw", args=[obj.reply.inbound_email_id])
            return format_html('Kept in the raw mail: <a href="{}">download .eml</a>', url)
        url = reverse("admin:inbound_email_replyattachment_download", args=[obj.pk])
        return format_html('<a href="{}">Download {}</a>', url, obj.filename)

    def get_urls(self):
        download = path(
            "<int:pk>/download/",
            self.admin_site.admin_view(self.download_view),
            name="inbound_email_replyattachment_download",
        )
        return [download, *super().get_urls()]

    def download_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        if not self.has_view_permission(request):
            return HttpResponse(status=403)
        obj = get_object_or_404(ReplyAttachment, pk=pk)
        try:
            data = attachment_content(attachment=obj)
        except InboundEmailError as exc:
            return HttpResponse(
                f"attachment unavailable: {exc}", status=404, content_type="text/plain"
            )
        # octet-stream + attachment + nosniff: the browser saves it, never renders it.
        response = HttpResponse(data, content_type="application/octet-stream")
        response["Content-Disposition"] = content_disposition_header(True, obj.filename)
        response["X-Content-Type-Options"] = "nosniff"
        return response
