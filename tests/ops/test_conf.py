"""ops.conf: the settings the ops app reads, each malformed one named in the error."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from ops.conf import get_config


def test_default_settings_are_valid(settings):
    config = get_config()
    assert config.var_dir == settings.VAR_DIR
    assert config.email_backend == settings.EMAIL_BACKEND


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("VAR_DIR", None, "VAR_DIR=None"),
        ("EMAIL_BACKEND", "", "EMAIL_BACKEND='' must be a non-empty string"),
        ("METRICS_TOKEN", 3, "METRICS_TOKEN=int must be a string"),
        ("Q_CLUSTER", {"workers": 0}, r"Q_CLUSTER\['workers'\]=0 \(from Q_WORKERS\) must be >= 1"),
    ],
)
def test_a_malformed_setting_names_the_variable(settings, name, value, message):
    setattr(settings, name, value)
    with pytest.raises(ImproperlyConfigured, match=message):
        get_config()
