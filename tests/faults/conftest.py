"""The fault harness for the tests of this folder: one proxy and one fork server for all."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.sweeps_scenario import NEW_PROPOSAL_SWEEP
from tests.support.cluster import AwsServer
from tests.support.fault_crash import django_on_cluster
from tests.support.fault_harness import FaultHarness
from tests.support.throwaway_pg import ThrowawayCluster

FOLDER = "tests/faults/"
# The runner's scenarios: the ones the crash harness runs (`crash_after`).
RUNNER_MODULES = [
    "tests.faults.handlers",
    "tests.faults.slot_handlers",
    "tests.faults.jobs_scenario",
    "tests.faults.slots_scenario",
    "tests.faults.caps_scenario",
]
SCENARIO_MODULES = [
    "tests.faults.handlers",
    "tests.faults.slot_handlers",
    "tests.faults.slots_scenario",
    "tests.faults.jobs_scenario",
    "tests.faults.intake_scenario",
    "tests.faults.relay_scenario",
    "tests.faults.sweeps_scenario",
    "tests.faults.minting_scenario",
    "tests.faults.caps_scenario",
    "tests.faults.rates_scenario",
    "tests.faults.producers_scenario",
    "tests.faults.snooze_scenario",
    "tests.faults.periodic_scenario",
]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The whole enumeration takes minutes per scenario (docs/architecture.md, fault
    injection): it runs only when asked for, with `-m slow` or `-m fault_enumeration` (.ci/run
    asks for it after the default run), not in the default run.

    Under pytest-xdist (`--dist loadgroup`) the tests of this folder run on one worker, one
    after another: the package's harnesses (a fork server with Django, moto's server, a
    throwaway cluster) start once, not once per worker, and no two faulted passes share the
    machine's two cores with each other."""
    for item in items:
        if item.nodeid.startswith(FOLDER):
            item.add_marker(pytest.mark.xdist_group("faults"))
    markexpr = config.getoption("markexpr") or ""
    if "fault_enumeration" in markexpr or "slow" in markexpr:
        return
    skip = pytest.mark.skip(
        reason="the whole enumeration: run with -m slow or -m fault_enumeration"
    )
    for item in items:
        if "fault_enumeration" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="package")
def _running_harness(django_db_setup, tmp_path_factory) -> Iterator[FaultHarness]:
    """One proxy, one fork server and moto's server (SES) for the tests of this folder:
    starting Django in a fork server costs seconds, a run through it a fraction of one."""
    with AwsServer() as aws:
        NEW_PROPOSAL_SWEEP.endpoint = aws.creds["AWS_ENDPOINT_URL"]
        workdir = tmp_path_factory.mktemp("faults")
        with FaultHarness(modules=SCENARIO_MODULES, workdir=workdir, env=aws.creds) as running:
            yield running


@pytest.fixture
def harness(_running_harness, transactional_db, tmp_path) -> FaultHarness:
    """The fault harness on this test's database (each run empties it first)."""
    _running_harness.workdir = tmp_path
    return _running_harness


@pytest.fixture(scope="package")
def _crash_harness(django_db_setup, tmp_path_factory) -> Iterator[FaultHarness]:
    """A proxy and a fork server on a throwaway cluster of the test database's schema,
    which the `crash_after` fault stops (`pg_ctl stop -m immediate`) and starts again
    (issue 37, point 5): a few seconds to make, once for the tests of this folder."""
    cluster = ThrowawayCluster().create()
    try:
        workdir = tmp_path_factory.mktemp("faults-crash")
        with FaultHarness(modules=RUNNER_MODULES, workdir=workdir, cluster=cluster) as running:
            yield running
    finally:
        cluster.destroy()


@pytest.fixture
def crash_harness(_crash_harness, transactional_db, tmp_path) -> Iterator[FaultHarness]:
    """The fault harness on the throwaway cluster; this test's Django connection points
    there while it runs (setup and check read the cluster), and back after."""
    _crash_harness.workdir = tmp_path
    assert _crash_harness.cluster is not None
    with django_on_cluster(_crash_harness.cluster):
        yield _crash_harness
