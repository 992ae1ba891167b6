"""Inbound stores in tests: the moto bucket's names, intake keys, a store that fails on purpose."""

from __future__ import annotations

from inbound_email.exceptions import StoreError

BUCKET = "inbound-test"  # the moto bucket of the s3_store fixture
PREFIX = "inbound/"  # its intake prefix


def key(store, name: str) -> str:
    """The intake key of `name` in a store (S3 keys carry the intake prefix)."""
    return getattr(store, "prefix", "") + name


class FlakyStore:
    """The folder store with an S3-like failure on get() for chosen keys (the edge, not us)."""

    def __init__(self, inner, *, failing: dict[str, bool]) -> None:
        self.inner = inner
        self.failing = failing  # key -> transient?
        self.description = "flaky"
        self.gets = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get(self, key: str) -> bytes:
        self.gets += 1
        if key in self.failing:
            raise StoreError(f"simulated failure on {key}", transient=self.failing[key])
        return self.inner.get(key)


def intake_keys(store) -> list[str]:
    """Every key still in the intake (all pages): what an operator would see waiting."""
    return [o.key for page in store.list() for o in page]
