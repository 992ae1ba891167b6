"""inbound_email_handle when the database session dies mid-mail (issue 11)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from inbound_email.models import InboundEmail
from inbound_email.poller import poll_once
from tests.support.mail import build_mail

pytestmark = pytest.mark.django_db(transaction=True)

_KILL_ONCE_ON_REPLY = """
CREATE SEQUENCE test_kill_once;
CREATE FUNCTION test_kill_session() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('test_kill_once') = 1 THEN  -- not rolled back: the fault happens once
        PERFORM pg_terminate_backend(pg_backend_pid());
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_kill_session BEFORE INSERT ON inbound_email_reply
    FOR EACH ROW EXECUTE FUNCTION test_kill_session();
"""


@pytest.fixture
def session_dies_on_first_reply():
    with connection.cursor() as cursor:
        cursor.execute(_KILL_ONCE_ON_REPLY)
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER IF EXISTS test_kill_session ON inbound_email_reply")
        cursor.execute("DROP FUNCTION IF EXISTS test_kill_session()")
        cursor.execute("DROP SEQUENCE IF EXISTS test_kill_once")


def test_a_mail_whose_session_died_is_retried_after_the_backoff_not_the_lease(
    settings, folder_store, make_notification, session_dies_on_first_reply
):
    """The session dies while the reply is recorded (server restart, `pg_terminate_backend`).
    The poll used to end with the OperationalError and leave the mail claimed until its
    lease ran out (CLAIM_LEASE_SECONDS, 10 minutes); the attempt is now counted as a
    transient failure on a fresh connection, the rest of the batch is handled, and the mail
    is retried after the ordinary backoff."""
    settings.INBOUND_EMAIL_RETRY_BASE_SECONDS = 1
    first, second = make_notification(), make_notification()
    folder_store.put("a", build_mail(token=first.token, body="4"))
    folder_store.put("b", build_mail(token=second.token, body="5"))
    before = timezone.now()

    summary = poll_once(store=folder_store)

    rows = {row.store_key: row for row in InboundEmail.objects.all()}
    assert summary.handled == 2
    failed = rows["a"] if rows["a"].status == InboundEmail.Status.RECEIVED else rows["b"]
    other = rows["b"] if failed is rows["a"] else rows["a"]
    assert other.status == InboundEmail.Status.PROCESSED
    assert failed.attempts == 1
    assert "terminating connection" in failed.last_error
    assert failed.next_attempt_at <= before + timedelta(seconds=10)  # the backoff, not the lease

    InboundEmail.objects.filter(pk=failed.pk).update(next_attempt_at=timezone.now())
    poll_once(store=folder_store)
    failed.refresh_from_db()
    assert (failed.status, failed.attempts) == (InboundEmail.Status.PROCESSED, 2)
