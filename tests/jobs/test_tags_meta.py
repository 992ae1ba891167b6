"""Tags and metadata (issue 38, points 1 and 5): stored by enqueue, found in the admin by
tag, by an exact meta value (`proposal=812`) and by unique key, through partial indexes
that jobs without them never enter."""

from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse

from jobs import enqueue
from jobs.models import Job

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:jobs_job_changelist")


def _ids(response) -> set[int]:
    return {job.pk for job in response.context["cl"].result_list}


def test_enqueue_stores_tags_and_meta_and_none_when_not_given():
    job = enqueue("tests.noop", tags=["slack", "draft"], meta={"proposal": 812, "pi": "Ada"})
    job.refresh_from_db()
    assert job.tags == ["slack", "draft"]
    assert job.meta == {"proposal": 812, "pi": "Ada"}
    plain = enqueue("tests.noop")
    plain.refresh_from_db()
    assert (plain.tags, plain.meta) == (None, None)  # NULL: no index entry, no bytes


def test_the_admin_filters_by_tag_and_finds_an_exact_meta_value_or_a_unique_key(admin_client):
    a = enqueue("tests.noop", tags=["slack"], meta={"proposal": 812})
    b = enqueue("tests.noop", tags=["email"], meta={"proposal": "812"})
    c = enqueue("tests.noop", meta={"proposal": 8120})
    d = enqueue("tests.noop", unique_key="draft:812")

    assert _ids(admin_client.get(CHANGELIST, {"tag": "slack"})) == {a.pk}
    assert _ids(admin_client.get(CHANGELIST, {"q": "proposal=812"})) == {a.pk, b.pk}
    assert _ids(admin_client.get(CHANGELIST, {"q": "proposal=8120"})) == {c.pk}
    assert _ids(admin_client.get(CHANGELIST, {"q": "key=draft:812"})) == {d.pk}
    assert _ids(admin_client.get(CHANGELIST, {"has_key": "yes"})) == {d.pk}
    page = admin_client.get(CHANGELIST).content.decode()
    assert "draft:812" in page and "slack" in page  # columns: unique key and tags
    detail = admin_client.get(reverse("admin:jobs_job_change", args=[a.pk])).content.decode()
    assert "proposal" in detail and "812" in detail


def _plan(sql: str, params: list) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_the_admins_tag_meta_and_key_lookups_are_served_by_their_partial_indexes(admin_client):
    from jobs.admin_search import jobs_with_meta, jobs_with_tag, live_jobs_with_unique_key

    for query, index in (
        (jobs_with_tag(Job.objects.all(), "slack"), "jobs_job_tags_idx"),
        (jobs_with_meta(Job.objects.all(), "proposal", "812"), "jobs_job_meta_idx"),
        (live_jobs_with_unique_key("draft:812"), "jobs_job_unique_key"),
    ):
        sql, params = query.query.sql_with_params()
        assert index in _plan(sql, list(params)), (index, _plan(sql, list(params)))


def test_indexes_of_tags_meta_and_keys_are_partial():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'jobs_job' "
            "AND indexname IN ('jobs_job_tags_idx', 'jobs_job_meta_idx')"
        )
        definitions = dict(cursor.fetchall())
    assert "tags IS NOT NULL" in definitions["jobs_job_tags_idx"]
    assert "gin" in definitions["jobs_job_tags_idx"]
    assert "meta IS NOT NULL" in definitions["jobs_job_meta_idx"]
    assert "jsonb_path_ops" in definitions["jobs_job_meta_idx"]
