"""The admin's ways to find jobs by what their producer gave them (issue 38, points 1 and 5):
a tag, an exact meta value, a unique key. Each query states its index's predicate (`tags IS
NOT NULL`, `meta IS NOT NULL`, the live statuses) so the planner may use the partial index
it names; none of them counts or scans the table.

Search box: `tag=slack`, `key=draft:812` (the unique key), any other `name=value` is an
exact meta value (`proposal=812` finds `{"proposal": 812}` and `{"proposal": "812"}`).
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet

from jobs.models import Job, JobUniqueKey

LIVE = [Job.Status.QUEUED, Job.Status.PROCESSING]


def jobs_with_tag(jobs: QuerySet[Job], tag: str) -> QuerySet[Job]:
    """`tags @> ARRAY[tag]` on jobs_job_tags_idx."""
    return jobs.filter(tags__isnull=False, tags__contains=[tag])


def _meta_values(value: str) -> list[Any]:
    """The typed text itself, and the JSON scalar it spells (812, true, null), if any."""
    values: list[Any] = [value]
    try:
        parsed = json.loads(value)
    except ValueError:
        return values
    if not isinstance(parsed, dict | list) and parsed != value:
        values.append(parsed)
    return values


def jobs_with_meta(jobs: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
    """`meta @> {name: value}` for each reading of `value`, on jobs_job_meta_idx."""
    match = Q()
    for candidate in _meta_values(value):
        match |= Q(meta__contains={name: candidate})
    return jobs.filter(Q(meta__isnull=False) & match)


def live_jobs_with_unique_key(key: str) -> QuerySet[Job]:
    """The queued or processing jobs holding `key` (one per kind), on jobs_job_unique_key."""
    return Job.objects.filter(unique_key__isnull=False, unique_key=key, status__in=LIVE)


def jobs_with_unique_key(jobs: QuerySet[Job], key: str) -> QuerySet[Job]:
    """The live jobs holding `key`, and the completed ones whose key is still kept
    (jobs_jobuniquekey): two indexed reads of ids. A finished job's key is not indexed past
    that: the index would cost every keyed job's claim and completion an entry more."""
    ids = [*live_jobs_with_unique_key(key).values_list("pk", flat=True)[:100]]
    ids += JobUniqueKey.objects.filter(unique_key=key).values_list("job_id", flat=True)[:100]
    return jobs.filter(pk__in=ids)


def search(jobs: QuerySet[Job], term: str) -> QuerySet[Job] | None:
    """The jobs a `name=value` search names, or None when the term is not one."""
    name, sep, value = term.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name or not value:
        return None
    if name == "tag":
        return jobs_with_tag(jobs, value)
    if name == "key":
        return jobs_with_unique_key(jobs, value)
    return jobs_with_meta(jobs, name, value)


class TagFilter(admin.SimpleListFilter):
    """`?tag=<tag>`: the jobs with that tag (no list of every tag: that is a scan)."""

    title = "tag"
    parameter_name = "tag"

    def lookups(self, request, model_admin):
        value = self.value()
        return [(value, value)] if value else []

    def queryset(self, request, queryset):
        return jobs_with_tag(queryset, self.value()) if self.value() else queryset


class UniqueKeyFilter(admin.SimpleListFilter):
    """`?has_key=yes`: the queued or running jobs holding a unique key (the partial unique
    index lists exactly those; a finished job's key is not indexed, so "every job that ever
    had a key" would be a walk of the table); `no`: jobs without a key."""

    title = "unique key"
    parameter_name = "has_key"

    def lookups(self, request, model_admin):
        return [("yes", "holding one (queued or running)"), ("no", "without")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(unique_key__isnull=False, status__in=LIVE)
        if self.value() == "no":
            return queryset.filter(unique_key__isnull=True)
        return queryset
