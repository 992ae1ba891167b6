"""The fault harness for the tests of this folder: one proxy and one fork server per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.sweeps_scenario import NEW_PROPOSAL_SWEEP
from tests.support.cluster import AwsServer
from tests.support.fault_harness import FaultHarness

SCENARIO_MODULES = [
    "tests.faults.handlers",
    "tests.faults.jobs_scenario",
    "tests.faults.intake_scenario",
    "tests.faults.relay_scenario",
    "tests.faults.sweeps_scenario",
    "tests.faults.minting_scenario",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The whole enumeration takes minutes per scenario (docs/architecture.md, fault
    injection): it runs only when asked for by its marker, not in the default run."""
    if "fault_enumeration" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="the whole enumeration: run with -m fault_enumeration")
    for item in items:
        if "fault_enumeration" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def harness(transactional_db, tmp_path) -> Iterator[FaultHarness]:
    with FaultHarness(modules=SCENARIO_MODULES, workdir=tmp_path) as running:
        yield running


@pytest.fixture
def aws_harness(transactional_db, tmp_path) -> Iterator[FaultHarness]:
    """The harness with moto's server (SES) running in this process, its address in the
    passes' environment."""
    with AwsServer() as aws:
        NEW_PROPOSAL_SWEEP.endpoint = aws.creds["AWS_ENDPOINT_URL"]
        with FaultHarness(modules=SCENARIO_MODULES, workdir=tmp_path, env=aws.creds) as running:
            yield running
