"""Admin: read-only views of the writer-slot leases and the messages table."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now

from canonical_ids.models import Message, WriterSlotLease
from canonical_ids.selectors import leases_live
from project.admin import ReadOnlyAdmin, SelectorFilter


class LeaseHealthFilter(SelectorFilter):
    choices_by_value = {"live": ("Held by a live writer", lambda now: leases_live(now=now))}


@admin.register(WriterSlotLease)
class WriterSlotLeaseAdmin(ReadOnlyAdmin):
    list_display = (
        "slot",
        "role",
        "holder_host",
        "holder_pid",
        "holder_started_at",
        "acquired_at",
        "renewed_at",
        "expires_at",
        "is_live",
        "last_ts",
    )
    list_filter = ("role", LeaseHealthFilter)
    search_fields = ("holder_host", "=holder_pid")

    def get_queryset(self, request):
        # Live is judged by the database's clock (issue 22): this host's may be minutes off.
        return (
            super()
            .get_queryset(request)
            .annotate(live=ExpressionWrapper(Q(expires_at__gt=Now()), output_field=BooleanField()))
        )

    @admin.display(boolean=True, description="live")
    def is_live(self, obj: WriterSlotLease) -> bool:
        return bool(obj.live)


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    list_display = ("run_id", "ts", "author", "source", "created_at")
    list_filter = ("source",)
    search_fields = ("=run_id", "=ts", "author")
    date_hierarchy = "created_at"
