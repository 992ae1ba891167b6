"""A module that records its own import (issue 28.7): the worker must refuse a task naming
it without importing it, since importing a module runs its code."""

from __future__ import annotations

from tests.support import import_log

import_log.IMPORTED.append(__name__)


def run() -> None:
    """What a hostile task would name."""


def hook(task: object) -> None:
    """What a hostile hook would name."""
