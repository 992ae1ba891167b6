"""Process life-cycle hooks and settings validation."""

from __future__ import annotations

import os

import pytest
from django.core.exceptions import ImproperlyConfigured
from django_q.signals import post_spawn

from canonical_ids.conf import get_config, parse_pool
from canonical_ids.models import WriterSlotLease


@pytest.mark.django_db(transaction=True)
def test_django_q_post_spawn_claims_the_slot_eagerly(process_minter):
    """A django-q2 worker process holds its slot from start-up, visible in the admin."""
    minter = process_minter()
    assert minter.slot is None
    post_spawn.send(sender="django_q", proc_name="Worker-1")
    assert minter.slot is not None and minter.slot not in (1, 2, 3)
    assert WriterSlotLease.objects.get(slot=minter.slot).holder_pid == os.getpid()


@pytest.mark.django_db(transaction=True)
def test_post_spawn_with_role_none_claims_nothing(settings, process_minter):
    """The hook itself, not the signal (which also starts issue 20's process beacon). With
    the database open, a hook that ignored the role would claim a slot here."""
    from canonical_ids.hooks import claim_slot_on_spawn

    settings.CANONICAL_IDS_ROLE = "none"
    minter = process_minter()
    claim_slot_on_spawn(sender="django_q", proc_name="Worker-1")
    assert minter.slot is None


def test_the_fork_hook_drops_the_inherited_slot(process_minter):
    """What os.register_at_fork runs in the child: no slot, no token, fresh lock."""
    from canonical_ids.hooks import drop_slot_after_fork

    minter = process_minter()
    minter._lock.acquire()  # a fork while another thread minted: the child must not deadlock
    drop_slot_after_fork()
    assert minter.slot is None
    assert minter._lock.acquire(timeout=1)
    minter._lock.release()


def test_pool_parsing():
    assert parse_pool("4,10-12") == (4, 10, 11, 12)
    assert len(parse_pool("4,10-99")) == 91
    with pytest.raises(ImproperlyConfigured, match="CANONICAL_IDS_WORKER_POOL"):
        parse_pool("4,x")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("CANONICAL_IDS_WORKER_POOL", "1,10-20", "fixed writers' slots"),
        ("CANONICAL_IDS_WORKER_POOL", "10-100", "outside"),
        ("CANONICAL_IDS_ROLE", "wrker", "CANONICAL_IDS_ROLE"),
        ("CANONICAL_IDS_RENEW_INTERVAL", 40.0, "at most half"),
    ],
)
def test_malformed_settings_fail_clearly(settings, name, value, message):
    setattr(settings, name, value)
    with pytest.raises(ImproperlyConfigured, match=message):
        get_config()


def test_default_settings_are_valid():
    config = get_config()
    assert config.modulus == 100 and config.role == "worker"
    assert config.fixed_slots == {"web": 1, "engine-aux": 2, "grantbot": 3}
    assert 4 in config.pool and not {1, 2, 3} & set(config.pool)
