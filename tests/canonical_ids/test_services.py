"""record_message: ids minted under a live lease, conflicts retried or raised, never dropped."""

from __future__ import annotations

import pytest
from django.db import transaction
from model_bakery import baker

from canonical_ids import mint_ts, record_message
from canonical_ids.exceptions import MessageConflict
from canonical_ids.minter import format_ts, parse_ts
from canonical_ids.models import Message, WriterSlotLease


@pytest.mark.django_db
def test_record_message_stores_a_message_with_a_minted_ts(process_minter):
    minter = process_minter()
    message = record_message(
        run_id="run-1",
        text="Please shorten the budget",
        author="pi",
        source="email",
        metadata={"mail_key": "k1"},
    )
    message.refresh_from_db()
    assert message.run_id == "run-1" and message.metadata == {"mail_key": "k1"}
    assert parse_ts(message.ts) % 100 == minter.slot
    assert minter.slot not in (1, 2, 3)


@pytest.mark.django_db
def test_record_message_inside_a_rolled_back_transaction_keeps_the_lease(process_minter):
    """The lease is written on its own connection: the caller's rollback does not undo it."""
    minter = process_minter()
    with pytest.raises(RuntimeError), transaction.atomic():
        record_message(run_id="run-rb", text="x", author="pi", source="email")
        raise RuntimeError("job failed")
    assert not Message.objects.filter(run_id="run-rb").exists()
    lease = WriterSlotLease.objects.get(slot=minter.slot)
    assert lease.holder_token == minter.token
    record_message(run_id="run-rb", text="y", author="pi", source="email")
    assert Message.objects.filter(run_id="run-rb").count() == 1


def _retried_with_a_fresh_id(process_minter, clock) -> None:
    minter = process_minter(time_source=clock.time, sleep=clock.sleep)
    first = parse_ts(mint_ts())
    taken = [format_ts(first + 100), format_ts(first + 200)]
    baker.make(Message, run_id="run-c", ts=taken[0], text="older")
    baker.make(Message, run_id="run-c", ts=taken[1], text="older too")
    message = record_message(run_id="run-c", text="new", author="pi", source="email")
    assert message.ts == format_ts(first + 300)
    assert Message.objects.filter(run_id="run-c").count() == 3
    assert minter.slot == parse_ts(message.ts) % 100


@pytest.mark.django_db
def test_conflicting_ts_is_retried_with_a_fresh_id_not_dropped(process_minter, clock):
    """V11: a (run_id, ts) already taken is retried with a fresh id (savepoint in a transaction)."""
    _retried_with_a_fresh_id(process_minter, clock)


@pytest.mark.django_db(transaction=True)
def test_conflicting_ts_is_retried_in_autocommit_too(process_minter, clock):
    """V11: the same outside any transaction (each insert its own transaction)."""
    _retried_with_a_fresh_id(process_minter, clock)


@pytest.mark.django_db
def test_conflicts_that_persist_raise_instead_of_dropping(process_minter, clock):
    """V11: a conflict that persists past the retries raises MessageConflict, never a drop."""
    process_minter(time_source=clock.time, sleep=clock.sleep)
    first = parse_ts(mint_ts())
    baker.make(
        Message,
        run_id="run-x",
        ts=iter([format_ts(first + 100 * i) for i in range(1, 11)]),
        _quantity=10,
    )
    with pytest.raises(MessageConflict):
        record_message(run_id="run-x", text="new", author="pi", source="email")
    assert Message.objects.filter(run_id="run-x", text="new").count() == 0
    assert Message.objects.filter(run_id="run-x").count() == 10


@pytest.mark.django_db(transaction=True)
def test_a_vanished_lease_is_claimed_again_before_the_insert(process_minter):
    """A cached slot whose lease row is gone (e.g. a flushed test database) is never used."""
    minter = process_minter()
    record_message(run_id="run-v", text="a", author="pi", source="email")
    old_token = minter.token
    WriterSlotLease.objects.all().delete()
    message = record_message(run_id="run-v", text="b", author="pi", source="email")
    assert minter.token != old_token
    lease = WriterSlotLease.objects.get(holder_token=minter.token)
    assert parse_ts(message.ts) % 100 == lease.slot
