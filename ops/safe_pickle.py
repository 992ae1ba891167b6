"""Reading django-q2's unsigned pickles (a task's args, kwargs and result) without running them.

django-q2 stores them in `django_q_task` with django-picklefield: base64 of a pickle, no
signature. Anyone who can write that table could make a plain `pickle.loads` run code in the
process that shows the row (the admin). So the admin reads them here instead: only plain data
(what pickle builds without a global: str, numbers, bytes, lists, dicts, tuples, sets) and a
few harmless classes (dates, times, Decimal); any other global refuses the whole value. This is
the "restricting globals" recipe of the `pickle` documentation.
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
import zlib
from dataclasses import dataclass
from typing import Any

ALLOWED_GLOBALS = frozenset(
    {
        ("datetime", "datetime"),
        ("datetime", "date"),
        ("datetime", "time"),
        ("datetime", "timedelta"),
        ("datetime", "timezone"),
        ("decimal", "Decimal"),
    }
)


class NotPlainData(pickle.UnpicklingError):
    """The pickle names a global outside ALLOWED_GLOBALS (it would call or build it)."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise NotPlainData(f"{module}.{name} is not plain data")


@dataclass(frozen=True)
class Loaded:
    ok: bool
    value: Any = None
    why: str = ""  # when not ok: why it is not shown

    def shown(self) -> str:
        return repr(self.value) if self.ok else f"(not shown: {self.why})"


def plain_loads(stored: str | None) -> Loaded:
    """A picklefield column's stored text as plain data, or why it is not shown."""
    if stored is None:
        return Loaded(ok=True, value=None)
    try:
        raw = base64.b64decode(stored.encode(), validate=False)
    except (binascii.Error, ValueError) as exc:
        return Loaded(ok=False, why=f"not base64 ({exc})")
    for candidate in (raw, _decompressed(raw)):
        if candidate is None:
            continue
        try:
            return Loaded(ok=True, value=_PlainUnpickler(io.BytesIO(candidate)).load())
        except NotPlainData as exc:
            return Loaded(ok=False, why=str(exc))
        except Exception:  # noqa: BLE001, S112 - not a pickle this way: try the next form
            continue
    return Loaded(ok=False, why="not a pickle")


def _decompressed(raw: bytes) -> bytes | None:
    try:
        return zlib.decompress(raw)  # picklefield's compress=True form
    except zlib.error:
        return None
