"""jobs.conf: every setting the job loop reads, each malformed one named in the error."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from jobs.conf import get_config
from tests.support.processes import child_env, manage_py


def test_default_settings_are_valid():
    config = get_config()
    assert config.heartbeat_seconds < config.lease_seconds
    assert (config.default_max_attempts, config.claim_batch_size) == (5, 20)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("JOBS_LEASE_SECONDS", "120", "JOBS_LEASE_SECONDS='120' must be a number"),
        ("JOBS_LEASE_SECONDS", 0, "JOBS_LEASE_SECONDS=0 must be > 0"),
        ("JOBS_HEARTBEAT_SECONDS", 500, "JOBS_HEARTBEAT_SECONDS=500 must be below JOBS_LEASE"),
        ("JOBS_BACKOFF_JITTER", -0.1, "JOBS_BACKOFF_JITTER=-0.1 must be >= 0"),
        ("JOBS_DEFAULT_MAX_ATTEMPTS", 0, "JOBS_DEFAULT_MAX_ATTEMPTS=0 must be a whole number"),
        ("JOBS_CLAIM_BATCH_SIZE", 2.5, "JOBS_CLAIM_BATCH_SIZE=2.5 must be a whole number"),
        ("JOBS_CLAIM_GATHER_SECONDS", -0.01, "JOBS_CLAIM_GATHER_SECONDS=-0.01 must be >= 0"),
        ("JOBS_EXTRA_HANDLER_MODULES", "app.handlers", "JOBS_EXTRA_HANDLER_MODULES='app.handlers'"),
        ("JOBS_DRAIN_SECONDS", None, "JOBS_DRAIN_SECONDS=None must be a number"),
        ("JOBS_POLL_SECONDS", 0, "JOBS_POLL_SECONDS=0 must be > 0"),
        (
            "JOBS_BATCH_IDEMPOTENT_COMPLETIONS",
            "yes",
            "JOBS_BATCH_IDEMPOTENT_COMPLETIONS='yes' must be True or False",
        ),
    ],
)
def test_a_malformed_setting_names_the_variable(settings, name, value, message):
    setattr(settings, name, value)
    with pytest.raises(ImproperlyConfigured, match=message):
        get_config()


@pytest.mark.django_db
def test_a_heartbeat_not_below_the_lease_stops_start_up():
    env = child_env(JOBS_LEASE_SECONDS="30", JOBS_HEARTBEAT_SECONDS="30")
    result = manage_py("check", env=env, timeout=60)
    assert result.returncode != 0
    assert "JOBS_HEARTBEAT_SECONDS=30.0 must be below JOBS_LEASE_SECONDS=30.0" in result.stderr


def test_a_changed_setting_is_read_again(settings):
    """get_config() is cached; override_settings / the settings fixture clear it."""
    assert get_config().claim_batch_size == 20
    settings.JOBS_CLAIM_BATCH_SIZE = 3
    assert get_config().claim_batch_size == 3
