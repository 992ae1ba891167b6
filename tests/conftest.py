"""Shared fixtures. Tests run on PostgreSQL (DATABASE_URL); see scripts/test."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from django.conf import settings

from tests.support import fast_password, quick_flush

pytest_plugins = [
    "tests.support.browser",
    "tests.support.suite_clock",
    "tests.support.long_first",
    "tests.support.xdist_groups",
    "tests.support.handler_registration",
]


def pytest_configure(config: pytest.Config) -> None:
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        raise pytest.UsageError(
            "The tests run on PostgreSQL: set "
            "DATABASE_URL=postgres://postgres@127.0.0.1:5432/worker "
            "(scripts/test does this for you)."
        )
    _worker_s_own_mail_folder()
    _process_s_own_pg_system_folder(config)
    fast_password.install()
    quick_flush.install()


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = getattr(config, "_pg_system_folder", None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


# Timing-sensitive tests: a deadline or a timeout well under a second that a loaded machine
# misses (a claim timeout of 0.3 s, a give-back after a hold, "started within 2 s"). They run
# in scripts/test's second pytest call, one at a time (the `serial` mark does the same for a
# test that carries it). Node id prefixes.
SERIAL = (
    "tests/system/test_scale_out.py",
    "tests/system/test_clock_skew.py",
    "tests/jobs/test_tasks.py::test_ten_quick_jobs_behind_a_slow_one_start_at_once",
    "tests/jobs/test_wakeup.py",
    "tests/jobs/test_linger.py",
    "tests/jobs/test_runner.py::test_an_error_whose_text_cannot_be_stored",
    "tests/jobs/test_runner.py::test_completion_after_a_reap_does_not_overwrite",
    "tests/jobs/test_runner_faults.py::test_a_handlers_base_exception_is_a_failure",
    "tests/jobs/test_services_guards.py::test_the_runner_rolls_back_an_attempt_whose_row",
    "tests/jobs/test_reaper.py::test_sigterm_finishes_the_running_job",
    "tests/canonical_ids/test_processes.py",
    # Three processes "start together" 8 s after they are spawned: a late one claims the
    # slot an early one has already released (seen beside three workers on a loaded host).
    "tests/canonical_ids/test_leases_guards.py::test_processes_claiming_at_once",
    "tests/inbound_email/services/test_relay.py::test_spent_budget_after_unknown_outcomes",
    # Issue 36: a back-dated commit starts within a second; the gather's batches by the clock.
    "tests/jobs/test_start_within_a_second.py",
    "tests/jobs/test_claim_gather.py",
    # Not here: the named fault cases (tests/faults/) run on one xdist worker, one after
    # another (tests/faults/conftest.py). Beside three busy workers a sweep's and a relay's
    # pass once ran out of their 1 s claim and never reached the faulted round trip ("a fault
    # never fired"); the pass now claims for 60 s and recovery still takes over at once.
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)


def _process_s_own_pg_system_folder(config: pytest.Config) -> None:
    """As root the embedded PostgreSQL keeps its data folders and binaries under a system
    folder (project/embedded_pg/layout.py, WORKER_PG_SYSTEM_DIR). Shared, two tests starting
    it on two xdist workers at once emptied each other's data folder (a start removes the
    data folders no var/ links to yet), and a test that closes the folder (0700) stopped
    every other start on the machine. Each pytest process gets a folder of its own (0755, the
    server's user passes through it), here and in the environment its children inherit,
    removed at the end. The settings imported the package before this hook, so its modules'
    copies of the path are pointed at the folder too."""
    if os.geteuid() != 0:
        return  # the system folder is used as root only
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    folder = Path(tempfile.mkdtemp(prefix=f"wpg-sys-{worker}-"))
    folder.chmod(0o755)
    config._pg_system_folder = folder  # type: ignore[attr-defined]
    os.environ["WORKER_PG_SYSTEM_DIR"] = str(folder)
    for name, module in list(sys.modules.items()):
        if name.split(".")[:2] == ["project", "embedded_pg"] and hasattr(module, "SYSTEM_DIR"):
            module.SYSTEM_DIR = folder  # type: ignore[attr-defined]
    if worker == "main":
        # The server's system user, made by the first start on a new machine: made here,
        # before the workers, so that two first starts on two workers do not both run useradd.
        from project.embedded_pg.prepare import _system_user

        _system_user()


def _worker_s_own_mail_folder() -> None:
    """Under pytest-xdist each worker has a database of its own (pytest-django's
    test_<name>_gw<N>, which tests.support.processes.child_env hands to the processes a test
    starts); the default mail folder under var/ is made the worker's own too, here and in the
    environment the child processes inherit, so a qcluster that one worker's test starts
    never polls the mail another worker's test left there."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker or "INBOUND_EMAIL_STORE" in os.environ:
        return
    from django.test.signals import setting_changed

    store = str(Path(settings.VAR_DIR) / f"inbound_mail_{worker}")
    os.environ["INBOUND_EMAIL_STORE"] = store
    settings.INBOUND_EMAIL_STORE = store
    # The apps' cached configurations are rebuilt on this signal (override_settings sends it).
    setting_changed.send(
        sender=type(settings), setting="INBOUND_EMAIL_STORE", value=store, enter=True
    )


@pytest.fixture
def subprocess_env(transactional_db) -> dict[str, str]:
    """Environment for a child `manage.py` / python process that must see the *test* database.

    pytest-django renames the database to test_<name>; a subprocess reading DATABASE_URL would
    otherwise open the dev database. Use with transaction=True tests so rows are committed.
    """
    from tests.support.processes import child_env

    return child_env()


@pytest.fixture(autouse=True)
def no_process_beacon_outlives_its_test():
    """A beat thread left running in the test process re-registers its row after every
    flush (its row "vanished") and shows as a live process in later tests — it did, from a
    test that sent django-q2's post_spawn. Stop it, and fail the test that left it."""
    yield
    import threading

    from processes import beacon

    leaked = [t.name for t in threading.enumerate() if t.name.startswith("process-beacon-")]
    if beacon._beacon is not None:
        beacon._beacon.stop()
        beacon._beacon = None
    if leaked:
        pytest.fail(f"the test left process beat threads running: {leaked}")


@pytest.fixture(autouse=True)
def no_minter_lease_outlives_its_test(django_db_blocker):
    """A test that mints through the process's minter (a canonical id) leaves it holding a
    writer slot, committed on a connection of its own, whose timer renews it in the next
    tests' database: a live lease no test made (issue 36, found in random order: one lease
    too many in test_host_clock, in test_health's tiles). Give the slot back after the test
    (its database is still there), so the timer stops and no later test sees it live."""
    yield
    from canonical_ids.minter import get_minter

    minter = get_minter()
    slot, token = minter.slot, minter.token
    if slot is None or token is None:
        return
    try:
        with django_db_blocker.unblock():
            minter.release()
    finally:
        minter.invalidate(slot=slot, token=token)


@pytest.fixture(autouse=True)
def no_claim_floor():
    """Each test starts with a full scan: this process's claim floor (jobs.claim_floor,
    issue 32) may have been raised by another test's clock, above the rows this one back-dates."""
    from jobs.claim_floor import claim_floor

    claim_floor.forget()
    yield
    claim_floor.forget()
