"""Modules that recorded their own import (tests/ops/import_recorder.py): a test can tell
whether anything imported a module it must never import, even if the module was removed
from sys.modules afterwards."""

from __future__ import annotations

IMPORTED: list[str] = []
