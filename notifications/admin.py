"""Admin: notification rows are read-only; preferences change only through service actions."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from notifications import services, suppression
from notifications.addresses import address_problem
from notifications.exceptions import NotificationError
from notifications.models import (
    DeliveryFeedback,
    EmailNotification,
    NotificationPreference,
    Proposal,
    Suppression,
    UnsubscribeRevocation,
)
from notifications.selectors import notifications_stuck_sending
from project.admin import SelectorFilter


@admin.register(Proposal)
class ProposalAdmin(admin.ModelAdmin):
    list_display = ("id", "title", "pi", "status", "created_at")
    list_filter = ("status",)
    search_fields = ("title",)
    raw_id_fields = ("pi",)

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # Deleting a proposal would delete its notifications and the replies to them.
        return False


class NotificationHealthFilter(SelectorFilter):
    choices_by_value = {
        "stuck_sending": (
            "Stuck in sending",
            lambda now: notifications_stuck_sending(now=now),
        ),
    }


@admin.register(EmailNotification)
class EmailNotificationAdmin(admin.ModelAdmin):
    list_display = ("id", "kind", "status", "user", "proposal", "attempts", "sent_at", "expires_at")
    list_filter = ("status", "kind", "failure_reason", NotificationHealthFilter)
    list_select_related = ("user", "proposal")
    search_fields = ("ses_message_id",)
    date_hierarchy = "created_at"
    actions = ["retry_failed"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[EmailNotification]:
        # The last error (a traceback) loads only on a notification's own page (issue 22).
        return super().get_queryset(request).defer("last_error")

    @admin.action(description="Retry sending (failed rows only)", permissions=["change"])
    def retry_failed(self, request: HttpRequest, queryset: QuerySet[EmailNotification]):
        ids = list(queryset.filter(status="failed").values_list("pk", flat=True))
        queued, refused = 0, []
        for notification_id in ids:
            try:  # each row in its own savepoint (the service's atomic block)
                services.notification_retry_failed(notification_id=notification_id)
                queued += 1
            except NotificationError as exc:
                refused.append(str(exc))
        self.message_user(request, f"Queued {queued} failed notification(s) again.")
        for line in refused:
            self.message_user(request, line, messages.WARNING)

    def get_readonly_fields(self, request: HttpRequest, obj: EmailNotification | None = None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(NotificationPreference)
class NotificationPreferenceAdmin(admin.ModelAdmin):
    list_display = ("user", "rung", "consecutive_missed", "downgraded_at", "updated_at")
    list_filter = ("rung",)
    list_select_related = ("user",)
    readonly_fields = ("user", "rung", "consecutive_missed", "downgraded_at", "updated_at")
    actions = ["restore_rung"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # Deleting a preference would silently put a paused user back on immediate.
        return False

    @admin.action(
        description="Restore rung (back to immediate, missed count reset)", permissions=["change"]
    )
    def restore_rung(self, request: HttpRequest, queryset: QuerySet[NotificationPreference]):
        user_ids = list(queryset.values_list("user_id", flat=True))
        for user_id in user_ids:
            services.preference_restore_rung(user_id=user_id)
        self.message_user(request, f"Restored {len(user_ids)} user(s).", messages.SUCCESS)


class ActiveSuppressionFilter(SelectorFilter):
    choices_by_value = {
        "active": ("Active", lambda now: suppression.active_suppressions(now=now)),
    }


class SuppressionAddForm(forms.ModelForm):
    """An address suppressed by hand: checked as a recipient is (one address, no line break,
    valid syntax) and refused when it is suppressed already."""

    address = forms.CharField(
        max_length=320,
        help_text="The address no sweep will mail any more (until the suppression is lifted).",
    )
    note = forms.CharField(
        required=False,
        max_length=4000,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Why: kept with the suppression, e.g. “asked by phone on 2026-12-04”.",
    )

    class Meta:
        model = Suppression
        fields = ()

    def clean_address(self) -> str:
        address = suppression.normalise(self.cleaned_data["address"])
        problem = address_problem(address)
        if problem:
            raise forms.ValidationError(f"Not an address to suppress: {problem}.")
        if suppression.address_is_suppressed(address, now=timezone.now()):
            raise forms.ValidationError(f"{address} is already suppressed.")
        return address


@admin.register(Suppression)
class SuppressionAdmin(admin.ModelAdmin):
    """The suppression list (issue 23): rows are read-only; lifting one ("unsuppress") needs
    the `notifications.unsuppress` permission and is logged in the row's history (LogEntry).
    An operator with `notifications.add_suppression` adds one by hand (issue 31.6): it calls
    `suppression_add`, which records and logs who did it; the admin's history has it too."""

    list_display = (
        "address",
        "reason",
        "suppressed_at",
        "suppressed_by",
        "expires_at",
        "lifted_at",
        "lifted_by",
    )
    list_filter = ("reason", ActiveSuppressionFilter)
    search_fields = ("address",)
    date_hierarchy = "suppressed_at"
    actions = ["unsuppress"]

    def has_unsuppress_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("notifications.unsuppress")

    @admin.action(description="Unsuppress (mail these addresses again)", permissions=["unsuppress"])
    def unsuppress(self, request: HttpRequest, queryset: QuerySet[Suppression]):
        now = timezone.now()
        lifted = 0
        by = request.user.get_username()
        for row in queryset:
            if suppression.suppression_lift(suppression=row, by=by, now=now):
                self.log_change(request, row, f"Unsuppressed (was: {row.reason})")
                lifted += 1
        self.message_user(request, f"Unsuppressed {lifted} address(es).", messages.SUCCESS)

    def get_readonly_fields(self, request: HttpRequest, obj: Suppression | None = None):
        return [f.name for f in self.model._meta.fields] if obj is not None else []

    def get_fields(self, request: HttpRequest, obj: Suppression | None = None):
        return super().get_fields(request, obj) if obj is not None else ["address", "note"]

    def get_form(self, request: HttpRequest, obj: Suppression | None = None, **kwargs):
        if obj is None:
            kwargs["form"] = SuppressionAddForm
        return super().get_form(request, obj, **kwargs)

    def save_model(self, request, obj, form, change) -> None:
        if change:
            return  # a suppression is never edited: lifted (unsuppress) or added
        row = suppression.suppression_add(
            address=form.cleaned_data["address"],
            note=form.cleaned_data["note"],
            by=request.user.get_username(),
            now=timezone.now(),
        )
        for field in Suppression._meta.concrete_fields:  # the admin logs and links `obj`
            setattr(obj, field.attname, getattr(row, field.attname))
        obj._state.adding = False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # lifting keeps the record; the feedback behind it stays


@admin.register(DeliveryFeedback)
class DeliveryFeedbackAdmin(admin.ModelAdmin):
    """Every bounce and complaint report received (read-only)."""

    list_display = ("address", "kind", "source", "occurred_at")
    list_filter = ("kind", "source")
    search_fields = ("address",)
    date_hierarchy = "occurred_at"

    def get_readonly_fields(self, request: HttpRequest, obj: DeliveryFeedback | None = None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(UnsubscribeRevocation)
class UnsubscribeRevocationAdmin(admin.ModelAdmin):
    """One-click unsubscribe links never expire: adding a row here revokes one (issue 23)."""

    list_display = ("notification", "revoked_at", "reason")
    raw_id_fields = ("notification",)
    search_fields = ("notification__token",)
