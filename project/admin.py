"""Admin building blocks shared by the apps."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import ClassVar

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.functional import cached_property

from project.db_clock import db_now

# A changelist counts at most this many rows of a filter (issue 20): COUNT(*) over a million
# jobs cost more than the rest of the page. The status counts above the job list stay exact.
LIST_COUNT_CAP = 10_000


class CappedCountPaginator(Paginator):
    """Counts at most LIST_COUNT_CAP rows (`SELECT count(*) FROM (... LIMIT cap)`): pages past
    that are not offered; filter further to reach older rows."""

    @cached_property
    def count(self) -> int:
        # Without the list's ORDER BY: kept, it made the count walk the primary key until
        # it found the cap's worth of matching rows.
        return self.object_list.order_by()[:LIST_COUNT_CAP].count()


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows are evidence: viewable, never added, edited or deleted by hand (actions that call
    services are the only way to change them)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


class SelectorFilter(admin.SimpleListFilter):
    """A changelist filter whose choices are the owning app's selectors (`?health=<choice>`).

    The health page links every tile here, so the rows an operator sees in the list are
    chosen by the same function that counted them: no second copy of "stuck" in a filter.
    Each selector takes `now` and returns a queryset of the admin's model.
    """

    title = "health"
    parameter_name = "health"
    choices_by_value: ClassVar[dict[str, tuple[str, Callable[[datetime], QuerySet]]]] = {}

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(value, label) for value, (label, _) in self.choices_by_value.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        choice = self.choices_by_value.get(self.value() or "")
        if choice is None:
            return queryset
        _, selector = choice
        # The database's clock: the web host's may be minutes off the workers' (issue 22).
        return queryset.filter(pk__in=selector(db_now()).values("pk"))
