"""I11: one user's failure in a sweep never affects another user's (defect V4, no rollback)."""

from __future__ import annotations

import logging
import threading
import time

import psycopg
import pytest
from django.db import IntegrityError, connection

from notifications.models import EmailNotification, SweepLease
from notifications.sweep_lease import sweep_lease_acquire
from notifications.sweeps import sweep_new_proposals
from project.db_clock import db_now
from tests.support import processes
from tests.support.held_sender import HeldSender, SweepInThread

Status = EmailNotification.Status


def _commit_when_blocked(conn: psycopg.Connection, done: threading.Event) -> None:
    """Commit `conn` as soon as another backend waits on a lock it holds (or after 10 s)."""
    with psycopg.connect(processes.test_database_url(), autocommit=True) as watcher:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            waiting = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()[0]
            if waiting:
                break
            time.sleep(0.02)
    conn.commit()
    done.set()


@pytest.mark.django_db(transaction=True)
def test_integrity_error_for_one_user_does_not_abort_the_sweep(make_pi, ses, caplog):
    """Defect V4: the old sweeps never rolled back, so one IntegrityError poisoned the session
    and the final commit aborted the cycle for every later user.

    The IntegrityError is real: another worker inserts user B's notice (uncommitted) before
    the sweep starts, so the sweep plans B's insert too, blocks on the unique index and gets a
    unique violation when the other worker commits. A and C must still be sent and committed,
    B's failure logged with user and sweep. Removing the per-user savepoint fails this test.
    """
    user_a, user_b, user_c = make_pi(), make_pi(), make_pi()
    proposal_b = user_b.proposals.get()
    other_worker = psycopg.connect(processes.test_database_url())
    other_worker.execute(
        "INSERT INTO notifications_emailnotification (user_id, kind, proposal_id, token, "
        "to_address, status, attempts, last_error, ses_message_id, created_at, updated_at) "
        "VALUES (%s, 'new_proposal', %s, %s, %s, 'pending', 0, '', '', now(), now())",
        (user_b.pk, proposal_b.pk, "ab" * 32, user_b.email),
    )
    done = threading.Event()
    committer = threading.Thread(target=_commit_when_blocked, args=(other_worker, done))
    committer.start()
    try:
        with caplog.at_level(logging.ERROR, logger="notifications.sweeps"):
            summary = sweep_new_proposals()
    finally:
        committer.join(timeout=15)
        other_worker.close()
    assert done.is_set()

    assert (summary.sent, summary.errors) == (2, 1)
    for user in (user_a, user_c):
        row = EmailNotification.objects.get(user=user)
        assert row.status == Status.SENT
        assert row.ses_message_id and row.sent_at
    assert sorted(ses.recipients()) == sorted([user_a.email, user_c.email])
    # B keeps only the other worker's row, untouched by our rolled-back savepoint.
    assert list(EmailNotification.objects.filter(user=user_b).values_list("token", "status")) == [
        ("ab" * 32, Status.PENDING)
    ]
    [record] = [
        r for r in caplog.records if getattr(r, "action", "") == "notification_sweep_user_error"
    ]
    assert record.user_id == user_b.pk and record.sweep == "new_proposal"
    assert isinstance(record.exc_info[1], IntegrityError)
    assert user_b.email not in caplog.text  # addresses are never logged

    # The other worker's pending row is an ordinary retry for the next cycle.
    assert sweep_new_proposals().sent == 1
    assert EmailNotification.objects.get(user=user_b).status == Status.SENT


@pytest.mark.django_db(transaction=True)
def test_a_sweep_already_running_elsewhere_is_not_run_twice(make_pi):
    """django-q2 re-enqueues a schedule even while its last run is still going. Another
    worker's cycle is caught mid-delivery (its lease held): this one does nothing."""
    first = make_pi()
    other = SweepInThread("new_proposal", HeldSender())
    other.start()
    assert other.sender.sending.wait(timeout=30)

    summary = sweep_new_proposals(sender=HeldSender())
    assert summary.busy and summary.users == 0 and summary.sent == 0

    assert other.finish().sent == 1
    assert other.sender.recipients == [first.email]
    second = make_pi()  # the lease went back with the other cycle's end: the next one runs
    released = HeldSender()
    released.release.set()
    assert sweep_new_proposals(sender=released).sent == 1
    assert released.recipients == [second.email]


@pytest.mark.django_db(transaction=True)
def test_a_dead_holders_sweep_runs_again_once_its_lease_expires(make_pi, settings):
    """A worker that took the lease and died never renews it nor gives it back: its lease
    runs out on the database's clock, and the next cycle runs."""
    settings.NOTIFICATION_SWEEP_LEASE_SECONDS = 1
    user = make_pi()
    died = threading.Thread(
        target=_take_the_lease_and_die, args=("new_proposal", "dead-host:1:feedc0ffee")
    )
    died.start()
    died.join()
    sender = HeldSender()
    sender.release.set()

    assert sweep_new_proposals(sender=sender).busy  # its lease is still live
    processes.wait_until(_lease_expired, "the dead holder's lease to expire", timeout=30)
    summary = sweep_new_proposals(sender=sender)

    assert not summary.busy and summary.sent == 1
    assert sender.recipients == [user.email]
    assert not SweepLease.objects.exists()  # given back at the end of the cycle


def _take_the_lease_and_die(kind: str, holder: str) -> None:
    try:
        assert sweep_lease_acquire(kind=kind, holder=holder, seconds=1) is not None
    finally:
        connection.close()


def _lease_expired() -> bool:
    return SweepLease.objects.filter(expires_at__lte=db_now()).exists()
