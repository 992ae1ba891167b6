"""canonical_ids.conf: a malformed setting names the variable (more cases in test_hooks.py)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from canonical_ids.conf import get_config


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("CANONICAL_IDS_WORKER_POOL", "10-100", "CANONICAL_IDS_WORKER_POOL: slots \\[100\\]"),
        ("CANONICAL_IDS_FIXED_SLOTS", {"web": 100}, "CANONICAL_IDS_FIXED_SLOTS .*'web': 100"),
        ("CANONICAL_IDS_FIXED_SLOTS", {"web": "1"}, "CANONICAL_IDS_FIXED_SLOTS=.* must map"),
        ("CANONICAL_IDS_LEASE_TTL", "a minute", "CANONICAL_IDS_LEASE_TTL='a minute' must be a"),
        ("CANONICAL_IDS_RENEW_INTERVAL", None, "CANONICAL_IDS_RENEW_INTERVAL=None must be a"),
        ("WRITER_SLOT_MODULUS", "ten", "WRITER_SLOT_MODULUS='ten' must be a number"),
    ],
)
def test_a_malformed_setting_names_the_variable(settings, name, value, message):
    setattr(settings, name, value)
    with pytest.raises(ImproperlyConfigured, match=message):
        get_config()
