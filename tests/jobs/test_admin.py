"""The jobs admin: counts, filters, search, readable errors, bulk actions via operator_actions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone
from model_bakery import baker

from jobs.models import Job
from tests.support.admin_columns import columns_read

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:jobs_job_changelist")


def _action(admin_client, action: str, ids: list[int] | None = None, post: str = "", **query):
    """The changelist's action on `ids` (None: "select all" across the filtered list); `post`
    = "yes" is the confirmation page's answer (Cancel asks first)."""
    data = {"action": action, "index": 0, **({"post": post} if post else {})}
    if ids is None:
        data.update(select_across=1, _selected_action=[Job.objects.values_list("pk")[0][0]])
    else:
        data["_selected_action"] = ids
    url = CHANGELIST + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")
    return admin_client.post(url, data, follow=True)


def _failed_jobs(quantity: int, **fields) -> None:
    """`quantity` jobs that failed permanently (3 of 3 attempts), bulk-created."""
    baker.make(
        Job,
        kind="k",
        status=Job.Status.FAILED,
        attempts=3,
        max_attempts=3,
        _quantity=quantity,
        _bulk_create=True,
        **fields,
    )


def _running_job() -> Job:
    return baker.make(
        Job,
        kind="k",
        status=Job.Status.PROCESSING,
        attempts=1,
        max_attempts=3,
        locked_by="w",
        lease_expires_at=timezone.now() + timedelta(minutes=2),
    )


def test_changelist_shows_counts_filters_and_finds_a_job_by_id(admin_client):
    failed = baker.make(
        Job,
        kind="mail.send",
        status=Job.Status.FAILED,
        attempts=5,
        max_attempts=5,
        failed_at=timezone.now(),
        last_error="smtplib.SMTPException: <refused> by relay\n\nTraceback ...",
    )
    baker.make(Job, kind="mail.send", max_attempts=5, _quantity=3)
    baker.make(Job, kind="reports.build", max_attempts=5)

    page = admin_client.get(CHANGELIST).content.decode()
    assert "Queued: <strong>4</strong>" in page
    assert "Failed: <strong>1</strong>" in page
    assert "smtplib.SMTPException: &lt;refused&gt; by relay" in page  # escaped, first line
    assert "?kind=tests.noop" in page  # kind filter choices come from the handler registry

    filtered = admin_client.get(CHANGELIST, {"status__exact": "failed", "kind": "mail.send"})
    assert list(filtered.context["cl"].result_list) == [failed]
    by_id = admin_client.get(CHANGELIST, {"q": f"#{failed.pk}"})
    assert list(by_id.context["cl"].result_list) == [failed]
    by_kind = admin_client.get(CHANGELIST, {"q": "reports"})
    assert [job.kind for job in by_kind.context["cl"].result_list] == ["reports.build"]

    detail = admin_client.get(reverse("admin:jobs_job_change", args=[failed.pk]))
    body = detail.content.decode()
    assert "<pre" in body and "&lt;refused&gt;" in body
    assert 'name="_save"' not in body  # view only: no hand editing


def test_retry_now_and_cancel_act_on_thousands_of_rows_in_a_few_queries(
    admin_client, django_assert_max_num_queries
):
    _failed_jobs(3000, failed_at=timezone.now())
    running = _running_job()

    with django_assert_max_num_queries(25):
        response = _action(admin_client, "retry_now")
    assert "3000 job(s) queued to run now." in response.content.decode()
    assert Job.objects.filter(status=Job.Status.QUEUED, failed_at__isnull=True).count() == 3000
    # one more attempt each, so attempts <= max_attempts still holds
    assert set(Job.objects.filter(status="queued").values_list("attempts", "max_attempts")) == {
        (3, 4)
    }
    running.refresh_from_db()
    assert running.status == Job.Status.PROCESSING  # a running job is not touched

    with django_assert_max_num_queries(25):
        response = _action(admin_client, "cancel", post="yes", status__exact="queued")
    assert "3000 job(s) cancelled." in response.content.decode()
    assert Job.objects.filter(status=Job.Status.CANCELLED).count() == 3000
    running.refresh_from_db()
    assert running.status == Job.Status.PROCESSING


def test_cancel_applies_to_failed_jobs_so_worker_status_stops_asking_for_action(
    admin_client, django_assert_max_num_queries
):
    """Review defect: cancel only touched queued rows, so a permanently failed job could only
    be retried (and fail again) and `worker_status` kept reporting it forever. Cancel now
    takes failed rows too; `failed_at` stays as history."""
    from ops.status import worker_status

    failed_at = timezone.now() - timedelta(hours=1)
    _failed_jobs(2000, failed_at=failed_at, last_error="RuntimeError: broken")
    queued = baker.make(Job, kind="k", max_attempts=3)
    running = _running_job()
    done = baker.make(
        Job,
        kind="k",
        status=Job.Status.COMPLETED,
        attempts=1,
        max_attempts=3,
        completed_at=timezone.now(),
    )
    assert any("failed permanently" in line for line in worker_status().needs_operator)

    with django_assert_max_num_queries(25):
        response = _action(admin_client, "cancel", post="yes", status__exact="failed")

    assert "2000 job(s) cancelled." in response.content.decode()
    cancelled = Job.objects.filter(status=Job.Status.CANCELLED)
    assert cancelled.count() == 2000
    assert not cancelled.filter(cancelled_at__isnull=True).exists()
    assert set(cancelled.values_list("failed_at", "attempts", "last_error")) == {
        (failed_at, 3, "RuntimeError: broken")
    }
    assert not Job.objects.filter(status=Job.Status.FAILED).exists()
    for job, status in ((queued, "queued"), (running, "processing"), (done, "completed")):
        job.refresh_from_db()
        assert job.status == status  # outside the filtered selection / not cancellable
    assert not any("failed permanently" in line for line in worker_status().needs_operator)

    # a completed job is never cancelled, even when selected explicitly; a running one's
    # worker is asked to stop it (issue 37, point 8: it ends cancelled once its handler has
    # stopped, tests/jobs/test_cancel_running.py), and it stays its worker's until then
    response = _action(admin_client, "cancel", ids=[running.pk, done.pk], post="yes")
    assert "0 job(s) cancelled. 1 running job(s) asked to stop" in response.content.decode()
    running.refresh_from_db()
    done.refresh_from_db()
    assert (running.status, done.status) == (Job.Status.PROCESSING, Job.Status.COMPLETED)
    assert running.cancel_requested_at is not None and running.locked_by == "w"


def test_the_changelist_never_loads_payloads_or_whole_errors_the_detail_page_does(admin_client):
    """Issue 22: 40 rows of 4 MB payloads added 330 MB to the web process; the list shows
    only the first line of the error, read as a prefix."""
    error = "Boom: first line\n" + "y" * 9000
    job = baker.make(Job, kind="big", payload={"blob": "x" * 100_000}, last_error=error)
    loaded = columns_read(admin_client, CHANGELIST, "jobs_job", ["payload", "last_error"])
    assert loaded == set()
    assert "Boom: first line" in admin_client.get(CHANGELIST).content.decode()
    detail = reverse("admin:jobs_job_change", args=[job.pk])
    assert columns_read(admin_client, detail, "jobs_job", ["payload", "last_error"]) == {
        "payload",
        "last_error",
    }


# --- the detail page (issue 20, point 6) ----------------------------------------------------


@pytest.fixture
def viewer_client(client, django_user_model):
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user(username="viewer", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(user)
    return client


def _detail(job: Job) -> str:
    return reverse("admin:jobs_job_change", args=[job.pk])


def test_the_detail_page_shows_each_attempt_and_retry_is_one_audited_click(admin_client):
    from django.contrib.admin.models import LogEntry

    from jobs import enqueue
    from jobs.runner import run_pending

    job = enqueue("tests.boom", {"message": "no <b>luck</b>"}, max_attempts=2)
    run_pending()
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now())
    run_pending()

    html = admin_client.get(_detail(job)).content.decode()
    table = html[html.index('id="attempts"') :].split("</table>")[0]
    assert table.count("<tr>") == 3  # the header and two attempts
    assert "Failed, retried" in table and "Failed for good" in table
    assert "RuntimeError: no &lt;b&gt;luck&lt;/b&gt;" in table  # escaped, and folded:
    assert "<details><summary>RuntimeError: no &lt;b&gt;luck&lt;/b&gt;</summary><pre>" in table
    assert 'action="' + reverse("admin:jobs_job_retry", args=[job.pk]) + '"' in html
    assert "Reap now" not in html

    page = admin_client.post(reverse("admin:jobs_job_retry", args=[job.pk]), follow=True)
    assert page.redirect_chain[-1][0] == _detail(job)
    job.refresh_from_db()
    assert job.status == Job.Status.QUEUED and job.attempts == 2 and job.max_attempts == 3
    entry = LogEntry.objects.get(object_id=str(job.pk))
    assert entry.get_change_message() == "queued to run now"


def test_a_stuck_job_shows_its_holder_and_lease_and_can_be_reaped(admin_client):
    from jobs.runner_step import job_claim_batch

    job = baker.make(Job, kind="k", max_attempts=3)
    job_claim_batch(worker="host-b:4242:dead", limit=1)
    expired = timezone.now() - timedelta(minutes=3)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=expired)

    html = admin_client.get(_detail(job)).content.decode()
    banner = html[html.index('id="stuck"') :].split("</p>")[0]
    assert "held by <strong>host-b:4242:dead</strong>" in banner
    assert f"{expired:%Y-%m-%d %H:%M:%S}" in banner
    listing = admin_client.get(CHANGELIST + "?health=stuck").content.decode()
    assert f"host-b:4242:dead, lease expired {expired:%H:%M:%S}" in listing

    admin_client.post(reverse("admin:jobs_job_reap", args=[job.pk]))
    job.refresh_from_db()
    assert job.status == Job.Status.QUEUED and job.locked_by == ""
    assert "host-b:4242:dead stopped heartbeating" in job.last_error


def _confirm(admin_client, page):
    """Submit a confirmation page's form as the browser would: its hidden fields, its action."""
    import html
    import re

    text = page.content.decode()
    form = text[text.index('id="cancel-confirm"') :].split("</form>")[0]
    action = html.unescape(
        re.search(
            r'action="([^"]*)"', text.split('id="cancel-confirm"')[0].rsplit("<form", 1)[1]
        ).group(1)
    )
    fields: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form):
        fields.setdefault(name, []).append(html.unescape(value))
    return admin_client.post(action, fields, follow=True), fields


def test_cancel_asks_first_and_its_form_carries_select_all_not_thousands_of_ids(admin_client):
    """Issue 36.8: the list's Cancel acted at once. Now, as "Delete selected", it shows what
    it will cancel; the page's form repeats the filter and "select all", and cancels on it."""
    _failed_jobs(3000, failed_at=timezone.now())
    running = _running_job()

    asked = _action(admin_client, "cancel", status__exact="failed")
    page = " ".join(asked.content.decode().split())
    assert (
        "Are you sure you want to cancel the 3000 selected job(s) that are queued, failed or "
        "running?" in page
    )
    assert page.count("<li>Job #") == 100 and "<li>and 2900 more</li>" in page
    assert not Job.objects.filter(status=Job.Status.CANCELLED).exists()

    done, fields = _confirm(admin_client, asked)
    assert fields["select_across"] == ["1"] and len(fields.get("_selected_action", [])) <= 1
    assert fields["post"] == ["yes"] and fields["action"] == ["cancel"]
    assert "3000 job(s) cancelled." in done.content.decode()
    assert Job.objects.filter(status=Job.Status.CANCELLED).count() == 3000
    running.refresh_from_db()
    assert running.status == Job.Status.PROCESSING


def test_cancel_of_picked_rows_confirms_exactly_those(admin_client):
    picked = baker.make(Job, kind="k", max_attempts=3, _quantity=3)
    other = baker.make(Job, kind="k", max_attempts=3)
    asked = _action(admin_client, "cancel", ids=[job.pk for job in picked[:2]])
    page = asked.content.decode()
    assert f"Job #{picked[0].pk}: k (Queued)" in page and f"Job #{picked[2].pk}:" not in page
    done, _ = _confirm(admin_client, asked)
    assert "2 job(s) cancelled." in done.content.decode()
    statuses = dict(Job.objects.values_list("pk", "status"))
    assert [statuses[j.pk] for j in (*picked, other)] == ["cancelled"] * 2 + ["queued"] * 2

    nothing = _action(admin_client, "cancel", ids=[picked[0].pk])  # already cancelled
    assert "nothing to cancel" in nothing.content.decode()


def test_the_jobs_cancel_button_asks_first_and_is_audited(admin_client):
    from django.contrib.admin.models import LogEntry

    job = baker.make(Job, kind="k", status=Job.Status.FAILED, attempts=3, max_attempts=3,
                     last_error="RuntimeError: broken\n\nTraceback ...")  # fmt: skip
    url = reverse("admin:jobs_job_cancel", args=[job.pk])
    assert f'action="{url}"' in admin_client.get(_detail(job)).content.decode()

    asked = admin_client.post(url)
    page = " ".join(asked.content.decode().split())
    assert f"Are you sure you want to cancel job #{job.pk}?" in page
    assert f"Job #{job.pk}: k (Failed) — RuntimeError: broken" in page
    assert f'href="{_detail(job)}" class="button cancel-link">No, take me back' in page
    job.refresh_from_db()
    assert job.status == Job.Status.FAILED

    done, fields = _confirm(admin_client, asked)
    assert fields.keys() == {"csrfmiddlewaretoken", "confirm"} and fields["confirm"] == ["yes"]
    assert done.redirect_chain[-1][0] == _detail(job)
    job.refresh_from_db()
    assert job.status == Job.Status.CANCELLED
    assert LogEntry.objects.get(object_id=str(job.pk)).get_change_message() == "cancelled"


def test_cancel_and_reap_only_where_they_apply(admin_client):
    done = baker.make(Job, kind="k", status=Job.Status.COMPLETED, attempts=1, max_attempts=1)
    html = admin_client.get(_detail(done)).content.decode()
    assert 'id="job-actions"' not in html
    page = admin_client.post(reverse("admin:jobs_job_cancel", args=[done.pk]), follow=True)
    assert "is completed: nothing done" in page.content.decode()
    running = _running_job()  # its lease is still running: not reapable
    admin_client.post(reverse("admin:jobs_job_reap", args=[running.pk]))
    running.refresh_from_db()
    assert running.status == Job.Status.PROCESSING


def test_the_detail_actions_need_the_change_permission(viewer_client):
    failed = baker.make(Job, kind="k", status=Job.Status.FAILED, attempts=3, max_attempts=3)
    html = viewer_client.get(_detail(failed)).content.decode()
    assert 'id="attempts"' in html and 'id="job-actions"' not in html
    for action in ("retry", "cancel", "reap"):
        response = viewer_client.post(reverse(f"admin:jobs_job_{action}", args=[failed.pk]))
        assert response.status_code == 403, action
    failed.refresh_from_db()
    assert failed.status == Job.Status.FAILED


def test_pausing_a_kind_in_the_admin_shows_on_the_job_and_the_health_page(admin_client):
    from django.contrib.admin.models import LogEntry

    from jobs.models import PausedKind

    response = admin_client.post(
        reverse("admin:jobs_pausedkind_add"), {"kind": "tests.noop", "note": "SES outage"}
    )
    assert response.status_code == 302
    paused = PausedKind.objects.get()
    assert (paused.kind, paused.paused_by) == ("tests.noop", "admin")
    assert LogEntry.objects.filter(object_repr__startswith="tests.noop").exists()
    refused = admin_client.post(reverse("admin:jobs_pausedkind_add"), {"kind": "not.registered"})
    assert refused.status_code == 200 and PausedKind.objects.count() == 1

    job = baker.make(Job, kind="tests.noop", max_attempts=1)
    assert 'id="paused"' in admin_client.get(_detail(job)).content.decode()
    health = admin_client.get("/admin/worker-health/").content.decode()
    assert 'id="paused-kinds"' in health and ">tests.noop</a>" in health

    admin_client.post(reverse("admin:jobs_pausedkind_delete", args=["tests.noop"]), {"post": "yes"})
    assert not PausedKind.objects.exists()  # resumed
