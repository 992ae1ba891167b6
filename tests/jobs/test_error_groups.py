"""Issue 20, point 5: failed jobs grouped by kind, exception class and normalised message,
with count, first and last seen, a link to exactly the group's jobs, and "Retry all"
(change permission, in the admin's log); issue 36.8: and "Cancel all", confirmed first."""

from __future__ import annotations

import html
import logging
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection, transaction
from django.urls import reverse
from django.utils import timezone
from model_bakery import baker

from jobs.error_groups import job_error_groups, jobs_in_error_group
from jobs.models import Job
from jobs.outcomes import format_error

pytestmark = pytest.mark.django_db

GROUPS_URL = reverse("admin:jobs_job_error_groups")


def _failed_job(kind: str, last_error: str, *, ago: int = 0) -> Job:
    return baker.make(
        Job,
        kind=kind,
        status=Job.Status.FAILED,
        attempts=3,
        max_attempts=3,
        failed_at=timezone.now() - timedelta(minutes=ago),
        last_error=last_error,
    )


@pytest.fixture
def failures() -> dict[str, list[Job]]:
    def failed(kind: str, error: str, ago: int) -> Job:
        return _failed_job(kind, f"{error}\n\nTraceback (most recent call last):\n  ...", ago=ago)

    return {
        "not_found": [
            failed("report.render", "ValueError: user 41 not found in 'acme'", 30),
            failed("report.render", "ValueError: user 97 not found in 'globex'", 5),
            failed("report.render", "ValueError: user 1203 not found in 'initech'", 10),
        ],
        "key": [failed("report.render", "KeyError: 'budget'", 3)],
        "other_kind": [failed("mail.send", "ValueError: user 41 not found in 'acme'", 1)],
        "decoy": [baker.make(Job, kind="report.render", status="queued", max_attempts=3)],
    }


def test_failures_are_grouped_by_kind_class_and_normalised_message(failures):
    groups = job_error_groups()
    top = groups[0]
    assert (top.kind, top.exception, top.message, top.count) == (
        "report.render",
        "ValueError",
        "user N not found in '…'",
        3,
    )
    oldest, newest = failures["not_found"][0], failures["not_found"][1]
    assert (top.first_seen, top.last_seen) == (oldest.failed_at, newest.failed_at)
    assert sorted((g.kind, g.exception, g.count) for g in groups[1:]) == [
        ("mail.send", "ValueError", 1),
        ("report.render", "KeyError", 1),
    ]


def test_a_groups_link_lists_exactly_its_jobs(admin_client, failures):
    page = admin_client.get(GROUPS_URL)
    html = page.content.decode()
    key = job_error_groups()[0].key
    link = f"?status__exact=failed&amp;error_group={key}"
    assert link in html
    listing = admin_client.get(
        reverse("admin:jobs_job_changelist"),
        {
            "status__exact": "failed",
            "error_group": key,
        },
    )
    assert listing.status_code == 200
    shown = {job.pk for job in listing.context["cl"].result_list}
    assert shown == {job.pk for job in failures["not_found"]}


def test_retry_all_retries_the_group_only_and_is_logged(admin_client, failures):
    key = job_error_groups()[0].key
    admin_client.post(reverse("admin:jobs_job_error_group_retry", args=[key]))
    statuses = {job.pk: job.status for job in Job.objects.all()}
    assert {statuses[j.pk] for j in failures["not_found"]} == {"queued"}
    assert statuses[failures["key"][0].pk] == statuses[failures["other_kind"][0].pk] == "failed"
    (entry,) = LogEntry.objects.all()
    assert entry.get_change_message() == f"retried error group {key}: 3 job(s)"


def test_cancel_all_asks_first_then_cancels_the_group_only_and_is_logged(
    admin_client, failures, caplog
):
    """Issue 36.8: no "Cancel all" for a group; Cancel acted without confirmation."""
    key = job_error_groups()[0].key
    url = reverse("admin:jobs_job_error_group_cancel", args=[key])
    row = admin_client.get(GROUPS_URL).content.decode().split(f'id="group-{key}"')[1]
    assert f'action="{url}"' in row.split("</tr>")[0]

    asked = admin_client.post(url)
    page = " ".join(html.unescape(asked.content.decode()).split())
    assert asked.status_code == 200
    assert "cancel the 3 failed job(s) of the group" in page
    assert "report.render: ValueError: user N not found in '…'" in page
    for job in failures["not_found"]:
        assert f"Job #{job.pk}: report.render (Failed)" in page
    assert not Job.objects.filter(status="cancelled").exists()  # asked, nothing done yet

    with caplog.at_level(logging.INFO, logger="jobs.error_groups"):
        done = admin_client.post(url, {"confirm": "yes"}, follow=True)
    assert "3 job(s) of the group cancelled." in done.content.decode()
    statuses = {job.pk: job.status for job in Job.objects.all()}
    assert {statuses[j.pk] for j in failures["not_found"]} == {"cancelled"}
    assert statuses[failures["key"][0].pk] == statuses[failures["other_kind"][0].pk] == "failed"
    assert statuses[failures["decoy"][0].pk] == "queued"
    (entry,) = LogEntry.objects.all()
    assert entry.get_change_message() == f"cancelled error group {key}: 3 job(s)"
    (line,) = [r for r in caplog.records if r.name == "jobs.error_groups"]
    assert line.getMessage() == f"error group {key} cancelled: 3 job(s)"
    assert (line.action, line.error_group, line.count) == ("error_group_cancelled", key, 3)
    assert key not in {group.key for group in job_error_groups()}


def test_cancel_all_leaves_a_member_retried_meanwhile(admin_client, failures):
    """The rules of one job's Cancel: a job of the group retried since the page was drawn is
    queued, out of the group, and stays queued."""
    key = job_error_groups()[0].key
    retried = failures["not_found"][0]
    Job.objects.filter(pk=retried.pk).update(status="queued", failed_at=None)
    url = reverse("admin:jobs_job_error_group_cancel", args=[key])
    assert f"Job #{retried.pk}:" not in admin_client.post(url).content.decode()
    admin_client.post(url, {"confirm": "yes"})
    retried.refresh_from_db()
    assert retried.status == "queued"
    assert Job.objects.filter(status="cancelled").count() == 2


def test_retry_all_needs_the_change_permission(client, django_user_model, failures):
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user(username="viewer", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(user)
    page = client.get(GROUPS_URL).content.decode()
    assert "Retry all" not in page and "Cancel all" not in page
    key = job_error_groups()[0].key
    assert client.post(reverse("admin:jobs_job_error_group_retry", args=[key])).status_code == 403
    cancel = reverse("admin:jobs_job_error_group_cancel", args=[key])
    assert client.post(cancel, {"confirm": "yes"}).status_code == 403
    assert client.post(cancel).status_code == 403
    assert Job.objects.filter(status="failed").count() == 5


def _group_of(job_id: int):
    """The group (from job_error_groups) whose link lists this job."""
    for group in job_error_groups():
        if job_id in set(jobs_in_error_group(group.key).values_list("pk", flat=True)):
            return group
    return None


def test_rows_failed_by_plain_sql_are_grouped_whatever_key_they_claim():
    """Another producer's rows are hostile input: a row inserted failed, a row updated to
    failed, and one that writes its own `error_group`, are each grouped by their real kind,
    class and message (the stored key is the database's, not the writer's)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
            "locked_by, last_error, failed_at) VALUES ('mail.send', '{}', 'failed', 0, 1, 1, "
            "'', E'TimeoutError: upstream took 31 s\\nTraceback ...', now()) RETURNING id"
        )
        inserted = cursor.fetchone()[0]
        cursor.execute(
            "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
            "locked_by, last_error) VALUES ('mail.send', '{}', 'queued', 0, 0, 1, '', '') "
            "RETURNING id"
        )
        updated = cursor.fetchone()[0]
        cursor.execute(
            "UPDATE jobs_job SET status = 'failed', failed_at = now(), "
            "last_error = 'TimeoutError: upstream took 90 s' WHERE id = %s",
            [updated],
        )
        cursor.execute(
            "INSERT INTO jobs_job (kind, payload, status, priority, attempts, max_attempts, "
            "locked_by, last_error, failed_at, error_group) VALUES ('mail.send', '{}', "
            "'failed', 0, 1, 1, '', 'TimeoutError: upstream took 2 s', now(), %s) RETURNING id",
            ["f" * 32],
        )
        forged = cursor.fetchone()[0]
        cursor.execute("UPDATE jobs_job SET error_group = 'forged' WHERE id = %s", [inserted])
    (group,) = job_error_groups()
    assert (group.kind, group.exception, group.message, group.count) == (
        "mail.send",
        "TimeoutError",
        "upstream took N s",
        3,
    )
    assert set(jobs_in_error_group(group.key).values_list("pk", flat=True)) == {
        inserted,
        updated,
        forged,
    }


def test_a_failed_rows_group_follows_its_kind_and_error_when_rewritten(failures):
    """The key is recomputed when a failed row's kind or error changes (plain SQL included),
    and when a retried job fails again with another error."""
    moved = failures["not_found"][0]
    with connection.cursor() as cursor:
        cursor.execute("UPDATE jobs_job SET kind = 'mail.send' WHERE id = %s", [moved.pk])
    assert _group_of(moved.pk).kind == "mail.send"
    assert _group_of(moved.pk).count == 2  # with the other kind's ValueError

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE jobs_job SET last_error = 'KeyError: ''total''' WHERE id = %s", [moved.pk]
        )
    assert (_group_of(moved.pk).exception, _group_of(moved.pk).kind) == ("KeyError", "mail.send")

    again = failures["key"][0]
    Job.objects.filter(pk=again.pk).update(status="queued", failed_at=None)
    assert _group_of(again.pk) is None  # not failed: in no group
    Job.objects.filter(pk=again.pk).update(
        status="failed", failed_at=timezone.now(), last_error="RuntimeError: boom 7"
    )
    assert (_group_of(again.pk).exception, _group_of(again.pk).message) == (
        "RuntimeError",
        "boom N",
    )


def test_the_key_of_an_error_with_control_and_multibyte_text_is_stored():
    """Hostile text in last_error (a separator byte, 4-byte characters, a huge first line)
    still fails the job and groups it: the key is fixed-width, so no index row is too big."""
    huge = "Ошибка\x1f" + "😀" * 5000 + ": " + "ü" * 100_000
    job = baker.make(
        Job,
        kind="k" * 100,
        status=Job.Status.FAILED,
        max_attempts=1,
        attempts=1,
        failed_at=timezone.now(),
        last_error=huge,
    )
    (group,) = job_error_groups()
    assert group.count == 1 and len(group.key) == 32
    assert set(jobs_in_error_group(group.key).values_list("pk", flat=True)) == {job.pk}


def _real_failure(job_kind: str, make_error) -> Job:
    """A job failed for good with the error an actual exception leaves (outcomes.format_error)."""
    try:
        make_error()
    except Exception as exc:  # noqa: BLE001 - the test records whatever it raised
        error = format_error(exc)
    return _failed_job(job_kind, error)


def _duplicate_address() -> None:
    from notifications.models import Suppression

    fields = {"reason": "complaint", "suppressed_at": timezone.now()}
    with transaction.atomic():
        Suppression.objects.create(address="twice@example.org", **fields)
        Suppression.objects.create(address="twice@example.org", **fields)


def test_a_group_shows_a_sample_with_the_key_and_the_constraint(admin_client):
    """Issue 31.6: the normalised message hides the KeyError's key and the constraint's name,
    which are what an operator needs: each group shows one member's message as it was."""
    _real_failure("report.render", lambda: {}["proposal_id"])
    _real_failure("mail.send", _duplicate_address)
    page = html.unescape(admin_client.get(GROUPS_URL).content.decode())
    assert "KeyError: 'proposal_id'" in page
    assert "notifications_suppression_address_key" in page
    assert "Key (address)=(twice@example.org) already exists." in page


def test_a_jobs_page_links_to_its_error_group(admin_client, failures):
    """The group was shown as an md5; it is a link to the group's jobs, named by its error."""
    job = failures["not_found"][0]
    page = admin_client.get(reverse("admin:jobs_job_change", args=[job.pk])).content.decode()
    changelist = reverse("admin:jobs_job_changelist")
    link = f"{changelist}?status__exact=failed&amp;error_group={job.error_group}"
    assert f'href="{link}"' in page
    anchor = page.split(f'href="{link}"', 1)[1].split("</a>", 1)[0]
    assert "ValueError" in anchor and job.error_group not in anchor
    listed = admin_client.get(html.unescape(link)).context["cl"].result_list
    assert {j.pk for j in listed} == {j.pk for j in failures["not_found"]}
