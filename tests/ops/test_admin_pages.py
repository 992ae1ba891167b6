"""Every admin page an operator opens renders, with rows in it."""

from __future__ import annotations

import re

import pytest
from django.contrib import admin
from django.urls import reverse
from model_bakery import baker

from canonical_ids import record_message
from inbound_email.models import InboundEmail
from jobs import enqueue
from notifications.models import EmailNotification, NotificationPreference, Proposal

pytestmark = pytest.mark.django_db


@pytest.fixture
def rows(django_user_model):
    pi = django_user_model.objects.create_user(username="pi", email="pi@example.org")
    NotificationPreference.objects.create(user=pi)
    proposal = Proposal.objects.create(title="Proposal", pi=pi, run_id="run-1")
    baker.make(EmailNotification, user=pi, proposal=proposal, kind="new_proposal")
    baker.make(
        InboundEmail,
        store_key="inbound/q-1",
        status=InboundEmail.Status.QUARANTINED,
        raw=b"Subject: <script>alert(1)</script>\r\n\r\nbody",
        headers_text="Subject: <script>alert(1)</script>",
        body_text="<b>not bold</b>",
    )
    enqueue("tests.noop", {"n": 1})
    record_message(run_id="run-1", text="hello", author="pi", source="email")


def test_every_registered_model_has_a_working_changelist_and_change_page(admin_client, rows):
    for model, model_admin in admin.site._registry.items():
        opts = model._meta
        changelist = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        response = admin_client.get(changelist)
        assert response.status_code == 200, (changelist, response.status_code)
        obj = model_admin.get_queryset(response.wsgi_request).first()
        if obj is not None:
            change = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
            response = admin_client.get(change)
            assert response.status_code == 200, (change, response.status_code)


def test_quarantined_mail_is_shown_escaped(admin_client, rows):
    row = InboundEmail.objects.get()
    page = admin_client.get(reverse("admin:inbound_email_inboundemail_change", args=[row.pk]))
    html = page.content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>not bold</b>" not in html


def _sections(html: str) -> list[str]:
    """The index's section captions, as a person reads them."""
    return [re.sub(r"<[^>]+>", "", caption).strip() for caption in CAPTION.findall(html)]


CAPTION = re.compile(r"<caption>(.*?)</caption>", re.S)


def test_the_index_names_each_section_once_and_spells_its_models(admin_client):
    """Issue 31.6: "Worker processs", and two "Operations" sections (the health link's and the
    ops app's): one section each, the Worker health page listed in Operations."""
    html = admin_client.get(reverse("admin:index")).content.decode()
    sections = _sections(html)
    assert len(sections) == len(set(sections)), sections
    assert "Operations" in sections
    assert "Worker processs" not in html and "Worker processes" in html
    (operations,) = re.findall(r">Operations</a>\s*</caption>(.*?)</table>", html, re.S)
    assert f'href="{reverse("ops:worker_health")}"' in operations


def test_staff_without_any_ops_model_still_find_the_health_page(client, django_user_model):
    staff = django_user_model.objects.create_user(username="staff", is_staff=True)
    client.force_login(staff)
    html = client.get(reverse("admin:index")).content.decode()
    assert _sections(html) == ["Operations"]
    assert f'href="{reverse("ops:worker_health")}"' in html


def test_every_page_is_titled_with_the_project_not_django(client, admin_client):
    """Issue 36.8: the header and the tab read "Django administration" / "Django site admin"."""
    pages = {
        "Log in": client.get(reverse("admin:login")),
        "Operator console": admin_client.get(reverse("admin:index")),
        "Worker health": admin_client.get(reverse("ops:worker_health")),
        "Select job to change": admin_client.get(reverse("admin:jobs_job_changelist")),
    }
    for title, response in pages.items():
        html = response.content.decode()
        assert f"<title>{title} | Proposal-assistant worker</title>" in html, title
        assert '<div id="site-name"><a href="/admin/">Proposal-assistant worker</a></div>' in html
        assert "Django" not in html.split("</header>")[0], title
