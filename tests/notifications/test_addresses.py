"""A user's address is checked when a notification is claimed (issue 10).

A CR/LF in `user.email` made Django raise BadHeaderError after the claim: the row stayed
`sending` for the claim timeout five times over and its last error blamed a crash. Now such a
row fails at once with reason invalid_address, and nothing reaches the mail service.
"""

from __future__ import annotations

import pytest
from django.core import mail
from model_bakery import baker

from notifications.addresses import address_problem
from notifications.models import EmailNotification
from notifications.sweeps import sweep_digests, sweep_new_proposals, sweep_proposal_reviews

pytestmark = pytest.mark.django_db

Status = EmailNotification.Status

BAD_ADDRESSES = [
    ("pi@example.org\r\nBcc: everyone@example.org", "contains a line break"),
    ("pi@example.org\nX-Injected: 1", "contains a line break"),
    ("pi@example.org, other@example.org", "several addresses"),
    ("pi@example.org; other@example.org", "several addresses"),
    ("Ada <pi@example.org> Bob <bob@example.org>", "several addresses"),
    ("not an address", "invalid syntax"),
    ("pi@", "invalid syntax"),
    ("Ada Lovelace <pi@example.org>", "invalid syntax"),
    ("pi@example.org\x00", "contains a control character"),
    ("p" * 250 + "@example.org", "longer than 254 characters"),
]


@pytest.mark.parametrize(("address", "problem"), BAD_ADDRESSES)
def test_address_problem_names_what_is_wrong(address, problem):
    assert address_problem(address) == problem


@pytest.mark.parametrize("address", ["pi@example.org", "ada.lovelace+grants@uni.example.ac.uk"])
def test_good_addresses_pass(address):
    assert address_problem(address) is None


@pytest.mark.parametrize(("address", "problem"), BAD_ADDRESSES[:6])
def test_new_request_to_an_invalid_address_fails_at_once(make_pi, address, problem):
    pi = make_pi(email=address)

    summary = sweep_proposal_reviews()

    row = EmailNotification.objects.get(user=pi)
    assert (row.status, row.failure_reason) == (Status.FAILED, "invalid_address")
    assert row.last_error == f"invalid_address: {problem}"
    assert row.claimed_at is None and row.to_address == ""
    assert mail.outbox == []
    assert (summary.sent, summary.errors, summary.invalid_address) == (0, 0, 1)
    # Failed for good: the next cycles neither ask again nor pile up rows.
    sweep_proposal_reviews()
    assert EmailNotification.objects.filter(user=pi).count() == 1


def test_pending_row_of_a_user_whose_address_went_bad_fails_when_claimed(make_pi):
    pi = make_pi()
    pending = baker.make(
        EmailNotification,
        user=pi,
        proposal=pi.proposals.get(),
        kind=EmailNotification.Kind.PROPOSAL_REVIEW,
        status=Status.PENDING,
        attempts=1,
    )
    pi.email = "pi@example.org\r\nBcc: everyone@example.org"
    pi.save()

    sweep_proposal_reviews()

    pending.refresh_from_db()
    assert (pending.status, pending.failure_reason) == (Status.FAILED, "invalid_address")
    assert pending.attempts == 1  # nothing was tried
    assert "crash" not in pending.last_error
    assert mail.outbox == []


def test_other_users_are_sent_to_in_the_same_cycle(make_pi):
    bad = make_pi(email="a@example.org, b@example.org")
    good = make_pi()

    summary = sweep_new_proposals()

    assert summary.sent == 1 and summary.invalid_address == 1
    assert [m.to for m in mail.outbox] == [[good.email]]
    assert EmailNotification.objects.get(user=bad).failure_reason == "invalid_address"


def test_digest_to_an_invalid_address_fails_at_once(make_pi):
    pi = make_pi(rung="daily", email="pi@example.org\r\n")

    sweep_digests()

    row = EmailNotification.objects.get(user=pi)
    assert (row.kind, row.status, row.failure_reason) == (
        "digest",
        Status.FAILED,
        "invalid_address",
    )
    assert mail.outbox == []
