"""The leases admin: who holds which slot, since when, until when; nothing editable."""

from __future__ import annotations

import os

import pytest

from canonical_ids.models import WriterSlotLease

pytestmark = pytest.mark.django_db(transaction=True)


def test_lease_admin_lists_holders_read_only(admin_client, minters):
    holder = minters()
    holder.mint()
    response = admin_client.get("/admin/canonical_ids/writerslotlease/")
    assert response.status_code == 200
    body = response.content.decode()
    assert str(os.getpid()) in body and holder.token not in body
    for column in ("holder host", "holder pid", "acquired at", "renewed at", "expires at"):
        assert column in body.lower()
    assert admin_client.get("/admin/canonical_ids/writerslotlease/add/").status_code == 403
    change = admin_client.post(
        f"/admin/canonical_ids/writerslotlease/{holder.slot}/change/", {"role": "web"}
    )
    assert change.status_code == 403
    assert WriterSlotLease.objects.get(slot=holder.slot).role == "worker"


def test_message_admin_is_read_only(admin_client):
    from canonical_ids import record_message

    message = record_message(run_id="run-a", text="hello", author="pi", source="email")
    assert admin_client.get("/admin/canonical_ids/message/").status_code == 200
    page = admin_client.get(f"/admin/canonical_ids/message/{message.pk}/change/")
    assert page.status_code == 200 and message.ts in page.content.decode()
    assert admin_client.get("/admin/canonical_ids/message/add/").status_code == 403
