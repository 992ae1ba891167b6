"""Run by tests/project/test_xdist_groups.py as `pytest -n 2 --dist loadgroup` (not collected
by the suite: the name does not start with test_). Each test writes the xdist worker it ran
on to a file named after it in PROBE_DIR; half of them are in one `xdist_group`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _record(name: str) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "none")
    (Path(os.environ["PROBE_DIR"]) / name).write_text(worker)


@pytest.mark.xdist_group("probe")
@pytest.mark.parametrize("n", range(8))
def test_grouped(n: int) -> None:
    _record(f"grouped-{n}")


@pytest.mark.parametrize("n", range(8))
def test_alone(n: int) -> None:
    _record(f"alone-{n}")
