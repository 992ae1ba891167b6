"""Fixtures of the canonical_ids tests."""

from __future__ import annotations

import pytest

from canonical_ids import minter as minter_module
from canonical_ids.minter import ProcessMinter
from tests.support.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def process_minter(monkeypatch: pytest.MonkeyPatch):
    """Install a fresh process minter (real clock) so no test inherits another's lease."""

    installed: list[ProcessMinter] = []

    def install(**kwargs) -> ProcessMinter:
        fresh = ProcessMinter(**kwargs)
        monkeypatch.setattr(minter_module, "_minter", fresh)
        installed.append(fresh)
        return fresh

    yield install
    for minter in installed:
        minter.release()  # give the slot back so the pool never runs dry across tests


@pytest.fixture
def minters():
    """Build extra process minters (as if in other processes); all released afterwards."""
    made: list[ProcessMinter] = []

    def make(**kwargs) -> ProcessMinter:
        made.append(ProcessMinter(**kwargs))
        return made[-1]

    yield make
    for minter in made:
        minter.release()
