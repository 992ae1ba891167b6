"""The `register` fixture (tests/support/handler_registration.py) leaves the registry as it
found it, the handlers our apps register at discovery included, when it was the first to
touch the registry in its process (stop 44: a serial part whose first test used it failed
later tests with "no handler registered for job kind 'inbound_email.relay_reply'")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.processes import PROJECT_ROOT

pytestmark = pytest.mark.slow


def test_registering_first_in_a_process_keeps_the_apps_handlers_for_later_tests():
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
        + ["-p", "no:xdist", "tests/support/registration_probe.py"],
        cwd=PROJECT_ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout, run.stdout
