"""A sweep whose database connection dies mid-batch (issue 11).

The sweep plans a batch of users in one transaction (a savepoint each). When that session
dies, the batch's claims are gone with it: nothing planned in it may be delivered, the
sweep's lease is given back on a fresh connection (issue 22: a lease row, no longer a
session advisory lock), and the next cycle sends every mail once.
"""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection

from notifications.models import EmailNotification, SweepLease
from notifications.sweeps import sweep_new_proposals

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def install_fault():
    """Run the fault's SQL (a trigger that terminates its own session); drop it afterwards
    (a flush between tests keeps functions, triggers and sequences)."""

    def install(sql: str, address: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(sql.replace("%s", "'" + address + "'"))

    yield install
    with connection.cursor() as cursor:
        cursor.execute(
            "DROP TRIGGER IF EXISTS test_kill_session ON notifications_emailnotification"
        )
        cursor.execute("DROP FUNCTION IF EXISTS test_kill_session()")
        cursor.execute("DROP SEQUENCE IF EXISTS test_kill_once")


_KILL_ON_INSERT = """
CREATE FUNCTION test_kill_session() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.to_address = %s THEN
        PERFORM pg_terminate_backend(pg_backend_pid());
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_kill_session BEFORE INSERT ON notifications_emailnotification
    FOR EACH ROW EXECUTE FUNCTION test_kill_session();
"""


def test_a_lost_connection_mid_batch_delivers_nothing_of_the_batch_then_sends_once(
    make_pi, ses, install_fault
):
    """The connection dies while planning the second of three users (a server restart or
    `pg_terminate_backend`). Treated as that user's failure, the sweep went on: the batch's
    transaction was silently rolled back, yet the first user's claim was still delivered
    (a mail for a row that no longer existed, then a second copy next cycle), and the lock
    release ran on a fresh session that did not hold it."""
    first, second, third = make_pi(), make_pi(), make_pi()
    install_fault(_KILL_ON_INSERT, second.email)

    with pytest.raises(OperationalError):
        sweep_new_proposals()

    assert ses.messages == []  # nothing of the lost batch left
    assert not EmailNotification.objects.exists()
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER test_kill_session ON notifications_emailnotification")
        cursor.execute("DROP FUNCTION test_kill_session()")
    assert not SweepLease.objects.exists()

    summary = sweep_new_proposals()

    assert summary.sent == 3
    assert sorted(ses.recipients()) == sorted([first.email, second.email, third.email])
    sent = EmailNotification.objects.filter(status=EmailNotification.Status.SENT)
    assert sorted(sent.values_list("ses_message_id", flat=True)) == sorted(
        message.id for message in ses.messages
    )


_KILL_ONCE_ON_SENT = """
CREATE SEQUENCE test_kill_once;
CREATE FUNCTION test_kill_session() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- nextval is not rolled back with the dying session: the fault happens once
    IF NEW.status = 'sent' AND NEW.to_address = %s AND nextval('test_kill_once') = 1 THEN
        PERFORM pg_terminate_backend(pg_backend_pid());
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_kill_session BEFORE UPDATE ON notifications_emailnotification
    FOR EACH ROW EXECUTE FUNCTION test_kill_session();
"""


def test_a_connection_lost_while_recording_a_send_is_recorded_after_reconnecting(
    make_pi, ses, install_fault
):
    """The session dies just as a send is recorded (SES has accepted the mail). The sweep
    used to log it and go on delivering on the dead connection: every later mail of the
    batch left but could not be recorded, so each was sent again after the claim timeout.
    The send is recorded on a fresh connection and the rest of the batch goes out once."""
    first, second, third = make_pi(), make_pi(), make_pi()
    install_fault(_KILL_ONCE_ON_SENT, second.email)

    summary = sweep_new_proposals()

    assert (summary.sent, summary.errors) == (3, 0)
    assert sorted(ses.recipients()) == sorted([first.email, second.email, third.email])
    sent = EmailNotification.objects.filter(status=EmailNotification.Status.SENT)
    assert sorted(sent.values_list("ses_message_id", flat=True)) == sorted(
        message.id for message in ses.messages
    )
