"""The fault harness for the tests of this folder: one proxy and one fork server per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fault_harness import FaultHarness

SCENARIO_MODULES = ["tests.faults.handlers", "tests.faults.jobs_scenario"]


@pytest.fixture
def harness(transactional_db, tmp_path) -> Iterator[FaultHarness]:
    with FaultHarness(modules=SCENARIO_MODULES, workdir=tmp_path) as running:
        yield running
