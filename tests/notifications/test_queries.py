"""Sweeps cost a bounded number of queries per user (no N+1): pinned here, measured in bench/."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from notifications.models import NotificationPreference
from notifications.sweeps import sweep_digests, sweep_new_proposals, sweep_proposal_reviews

pytestmark = pytest.mark.django_db
Rung = NotificationPreference.Rung


def _queries(sweep, **kwargs) -> tuple[int, object]:
    with CaptureQueriesContext(connection) as captured:
        summary = sweep(**kwargs)
    return len(captured), summary


@pytest.mark.parametrize(
    ("sweep", "rung", "per_user"),
    [
        # SAVEPOINT, INSERT ... RETURNING (the claimed row), RELEASE, UPDATE sent
        (sweep_new_proposals, None, 4),
        (sweep_proposal_reviews, None, 4),
        (sweep_digests, Rung.DAILY, 4),
    ],
)
def test_sending_sweeps_cost_a_fixed_number_of_queries_per_user(make_pi, sweep, rung, per_user):
    """Twice the users with mail due: the extra queries are `per_user` for each extra user."""
    for _ in range(3):
        make_pi(proposals=2, rung=rung)
    small, first = _queries(sweep, batch_size=100)
    for _ in range(6):
        make_pi(proposals=2, rung=rung)
    large, second = _queries(sweep, batch_size=100)
    mails_per_user = 2 if rung is None else 1  # a notice per proposal, or one digest
    assert (first.sent, second.sent) == (3 * mails_per_user, 6 * mails_per_user)
    # Users already served cost no query (they are either no candidates or skipped in memory).
    extra_users = second.sent // mails_per_user - first.sent // mails_per_user
    # One INSERT claims all of a user's mails; each accepted mail costs its own UPDATE.
    assert large - small == extra_users * (per_user + mails_per_user - 1)
    assert per_user <= 5


def test_expiry_cycle_costs_a_fixed_number_of_queries_per_user(make_pi):
    """Expiry adds one statement: the expire UPDATE and the ladder's preference upsert."""
    t0 = timezone.now()
    for _ in range(3):
        make_pi()
    sweep_proposal_reviews(now=t0)
    small, summary = _queries(sweep_proposal_reviews, now=t0 + timedelta(days=4))
    assert (summary.users, summary.expired, summary.sent) == (3, 3, 3)
    for _ in range(6):
        make_pi()
    sweep_proposal_reviews(now=t0 + timedelta(days=5))
    large, summary = _queries(sweep_proposal_reviews, now=t0 + timedelta(days=9))
    assert (summary.users, summary.expired, summary.sent) == (9, 9, 9)
    # SAVEPOINT, expire + preference upsert (one statement), INSERT, RELEASE, UPDATE sent
    assert (large - small) / 6 == 5


def test_idle_sweep_reads_in_batches_only(make_pi):
    for _ in range(5):
        make_pi()
    sweep_new_proposals()
    queries, summary = _queries(sweep_new_proposals, batch_size=2)
    # lease taken + given back, reconcile (2 UPDATEs), the sending-pause read before the batch
    # (issue 23), one empty batch read (in the batch's SAVEPOINT/RELEASE here, as the test
    # runs in a transaction)
    assert summary.users == 0 and queries == 8
