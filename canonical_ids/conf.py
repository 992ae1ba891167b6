"""The app's settings, read when needed (so tests can override them) and validated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

WORKER_ROLE = "worker"
NO_ROLES = frozenset({"", "none"})


def parse_pool(spec: str) -> tuple[int, ...]:
    """ "4,10-99" -> (4, 10, 11, ..., 99); ranges are inclusive."""
    slots: set[int] = set()
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        try:
            if "-" in part:
                low, high = (int(x) for x in part.split("-", 1))
                slots.update(range(low, high + 1))
            else:
                slots.add(int(part))
        except ValueError as exc:
            raise ImproperlyConfigured(
                f"CANONICAL_IDS_WORKER_POOL={spec!r}: expected slots like '4,10-99'"
            ) from exc
    return tuple(sorted(slots))


@dataclass(frozen=True)
class Config:
    role: str
    modulus: int
    fixed_slots: dict[str, int]
    pool: tuple[int, ...]
    lease_ttl: float  # seconds
    renew_interval: float  # seconds

    def slot_for_fixed_role(self) -> int | None:
        return self.fixed_slots.get(self.role)


def _number(name: str, default: float, convert: type[int] | type[float]) -> Any:
    value = getattr(settings, name, default)
    try:
        if isinstance(value, bool):
            raise TypeError("a boolean")
        return convert(value)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"{name}={value!r} must be a number") from exc


def _fixed_slots() -> dict[str, int]:
    value = getattr(settings, "CANONICAL_IDS_FIXED_SLOTS", {})
    if not isinstance(value, dict) or not all(
        isinstance(role, str) and isinstance(slot, int) and not isinstance(slot, bool)
        for role, slot in value.items()
    ):
        raise ImproperlyConfigured(
            f"CANONICAL_IDS_FIXED_SLOTS={value!r} must map role names to slot numbers"
        )
    return dict(value)


def get_config() -> Config:
    modulus = _number("WRITER_SLOT_MODULUS", 100, int)
    fixed = _fixed_slots()
    pool = parse_pool(str(getattr(settings, "CANONICAL_IDS_WORKER_POOL", "4,10-99")))
    ttl = _number("CANONICAL_IDS_LEASE_TTL", 60.0, float)
    renew = _number("CANONICAL_IDS_RENEW_INTERVAL", 20.0, float)
    role = str(getattr(settings, "CANONICAL_IDS_ROLE", WORKER_ROLE)).strip().lower()
    if modulus < 2 or 1_000_000 % modulus:
        raise ImproperlyConfigured(f"WRITER_SLOT_MODULUS={modulus} must divide 1,000,000")
    bad_pool = [s for s in pool if not 0 <= s < modulus]
    if bad_pool:
        raise ImproperlyConfigured(
            f"CANONICAL_IDS_WORKER_POOL: slots {bad_pool} are outside 0..{modulus - 1}"
        )
    bad_fixed = {role: s for role, s in fixed.items() if not 0 <= s < modulus}
    if bad_fixed:
        raise ImproperlyConfigured(
            f"CANONICAL_IDS_FIXED_SLOTS (CANONICAL_IDS_SLOT_<ROLE>): slots {bad_fixed} are "
            f"outside 0..{modulus - 1}"
        )
    clash = sorted(set(pool) & set(fixed.values()))
    if clash:
        raise ImproperlyConfigured(
            f"CANONICAL_IDS_WORKER_POOL contains the fixed writers' slots {clash}"
        )
    if not pool:
        raise ImproperlyConfigured("CANONICAL_IDS_WORKER_POOL is empty")
    if renew * 2 > ttl:
        raise ImproperlyConfigured(
            f"CANONICAL_IDS_RENEW_INTERVAL={renew} must be at most half of "
            f"CANONICAL_IDS_LEASE_TTL={ttl}"
        )
    if role not in NO_ROLES and role != WORKER_ROLE and role not in fixed:
        raise ImproperlyConfigured(
            f"CANONICAL_IDS_ROLE={role!r}: use 'worker', 'none' or one of {sorted(fixed)}"
        )
    return Config(role, modulus, fixed, pool, ttl, renew)
