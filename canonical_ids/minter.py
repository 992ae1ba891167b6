"""Minting canonical ids: "SSSSSSSSSS.uuuuuu" with micro part congruent to the writer slot.

`TsMinter` is the pure arithmetic for one slot (time source injectable). `ProcessMinter` is
the one per OS process: it holds a lease on a slot (canonical_ids.leases), renews it on mint
when due and on a timer thread while it holds it (so an idle holder's slot stays held and
shows as held), drops it in a forked child, and never mints without one (I1). Ids of one process
are strictly increasing, across slot changes too (I2).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import DatabaseError
from django.utils import timezone

from canonical_ids import leases
from canonical_ids.conf import NO_ROLES, WORKER_ROLE, Config, get_config
from canonical_ids.exceptions import NoWriterSlot
from project.quiet_log import QuietLog

logger = logging.getLogger(__name__)

MICROS = 1_000_000
MIN_WAIT = 0.0005  # seconds; floor of a wait for the next tick
RENEW_RETRY_SECONDS = 1.0  # seconds between tries of a renewal that failed (lease still valid)


def format_ts(value: int) -> str:
    return f"{value // MICROS:010d}.{value % MICROS:06d}"


def parse_ts(ts: str) -> int:
    seconds, _, micros = ts.partition(".")
    return int(seconds) * MICROS + int(micros or 0)


class TsMinter:
    """Strictly increasing ids in one residue class (slot) modulo `modulus`.

    A tick (second) holds MICROS / modulus values (10,000 for 100). When they are used up and
    the clock is still in that tick, wait for the next one. When the clock is behind the last
    id (stepped back), keep counting from the last id, carrying into the next tick if needed:
    never a repeat, never a wait of unbounded length.
    """

    def __init__(
        self,
        slot: int,
        *,
        modulus: int = 100,
        floor: int = 0,
        time_source: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not 0 <= slot < modulus or MICROS % modulus:
            raise ValueError(f"slot {slot} / modulus {modulus} invalid")
        self.slot = slot
        self.modulus = modulus
        self.last = floor  # the last value issued (or the floor to start above)
        self._time = time_source
        self._sleep = sleep

    def _next_in_class(self, above: int) -> int:
        """The smallest value > `above` congruent to the slot."""
        value = above - above % self.modulus + self.slot
        return value if value > above else value + self.modulus

    def next_value(self) -> int:
        while True:
            now = self._time()
            now_s = int(now)
            value = self._next_in_class(max(self.last, now_s * MICROS - 1))
            value_s = value // MICROS
            if value_s > now_s and self.last // MICROS == now_s:
                # This tick's values are used up and the clock is in it: wait for the next.
                self._sleep(max(MIN_WAIT, value_s - now))
                continue
            self.last = value
            return value

    def mint(self) -> str:
        return format_ts(self.next_value())


@dataclass
class _Held:
    lease: leases.Lease
    renew_due: float  # monotonic seconds
    valid_until: float  # monotonic seconds; never mint past this without a renewal
    database: tuple  # leases.database_key() when claimed


class ProcessMinter:
    """The minter of this OS process: one leased slot, renewed on mint, dropped on fork."""

    def __init__(
        self,
        *,
        config: Callable[[], Config] = get_config,
        time_source: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        renew_on_timer: bool = True,
    ) -> None:
        self._config = config
        self._renew_on_timer = renew_on_timer  # False: renewed only on a mint (tests of that path)
        self._time = time_source
        self._sleep = sleep
        self._monotonic = monotonic
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._renewer: threading.Thread | None = None  # a thread does not survive a fork
        self._held: _Held | None = None
        self._renewing: _Held | None = None  # the lease a thread renews without the lock
        self._ts: TsMinter | None = None
        self._pid = os.getpid()
        self._started_at = timezone.now()
        # A renewal failing through an outage: one line, then a count per 30 s (I24).
        self._quiet = QuietLog(logger, "writer slot renewal")

    # --- public ---------------------------------------------------------------------------
    @property
    def slot(self) -> int | None:
        held = self._held
        return held.lease.slot if held else None

    @property
    def token(self) -> str | None:
        held = self._held
        return held.lease.token if held else None

    def mint(self) -> str:
        return self.mint_with_lease()[0]

    def mint_with_lease(self) -> tuple[str, int, str]:
        """Mint an id; also return the (slot, token) of the lease it was minted under.

        A renewal that is due while the lease is still valid runs without the mint lock
        (`_renew_unlocked`): the other threads keep minting under the valid lease meanwhile.
        Held across the renewal, the lock made every minting thread wait for it, each inside
        its handler's transaction; behind PgBouncer those transactions held every server
        connection, and the renewal's own connection waited for one of them: the scale-out
        rehearsal stalled with 10 slots per process (issue 37, the connection budget)."""
        while True:
            with self._lock:
                self._check_pid()
                renewal = self._start_renewal()
                if renewal is None:
                    held = self._ensure_lease()
                    assert self._ts is not None
                    return format_ts(self._ts.next_value()), held.lease.slot, held.lease.token
            self._renew_unlocked(*renewal)

    def acquire(self) -> int:
        """Claim (or renew) the slot now rather than on the first mint; returns the slot."""
        with self._lock:
            self._check_pid()
            return self._ensure_lease().lease.slot

    def invalidate(self, *, slot: int, token: str) -> None:
        """Forget a lease found gone (e.g. its row was deleted); the next mint claims again."""
        with self._lock:
            if self._held and self._held.lease.token == token:
                logger.warning(
                    "Writer slot %s lease is gone; claiming again",
                    slot,
                    extra={"action": "slot_lost", "slot": slot},
                )
                self._held = None

    def release(self) -> None:
        """Give the slot back (clean shutdown) so it need not wait for expiry."""
        with self._lock:
            if self._held is None or self._pid != os.getpid():
                return
            held, self._held = self._held, None
            if held.database != leases.database_key():
                return  # leased in another database (a test database, since dropped)
            leases.lease_release(
                slot=held.lease.slot, token=held.lease.token, last_ts=self._last_ts()
            )

    def renew_if_due(self) -> float | None:
        """Renew the held lease if its renewal is due (the timer's call); never claim a new
        slot from here. Returns seconds until the next renewal is due, None when nothing is
        held any more (released, forked, the database changed): the timer then stops."""
        with self._lock:
            held = self._held
            if held is None or self._pid != os.getpid():
                return None
            if held.database != leases.database_key():
                return None
            renewal = self._start_renewal()
            if renewal is None:
                if self._monotonic() >= held.renew_due:
                    held = self._ensure_lease()
                return max(0.0, held.renew_due - self._monotonic())
        self._renew_unlocked(*renewal)
        with self._lock:
            held = self._held
            if held is None:
                return None
            return max(0.0, held.renew_due - self._monotonic())

    def after_fork_in_child(self) -> None:
        """A forked child must not mint in its parent's slot: drop everything inherited."""
        self._reset()

    # --- internals ------------------------------------------------------------------------
    def _check_pid(self) -> None:
        # Belt and braces for forks that bypass os.register_at_fork (none known).
        if self._pid != os.getpid():
            self._reset_unlocked()

    def _reset_unlocked(self) -> None:
        self._held = None
        self._ts = None
        self._pid = os.getpid()
        self._started_at = timezone.now()
        self._quiet = QuietLog(logger, "writer slot renewal")

    def _last_ts(self) -> str:
        return format_ts(self._ts.last) if self._ts and self._ts.last else ""

    def _ensure_lease(self) -> _Held:
        now = self._monotonic()
        held = self._held
        if held is not None and held.database != leases.database_key():
            held = self._held = None  # the default database changed (test set-up): claim anew
        if held is not None and now < held.renew_due:
            return held
        if held is not None and self._renewing is held and now < held.valid_until:
            return held  # another thread is renewing it, without the lock: still valid
        config = self._config()
        if held is not None:
            try:
                renewed = leases.lease_renew(
                    slot=held.lease.slot,
                    token=held.lease.token,
                    last_ts=self._last_ts(),
                    ttl=config.lease_ttl,
                )
            except DatabaseError as exc:
                return self._renewal_failed(held, exc)
            if self._renewal_done(held, renewed, now, config):
                return held
        return self._acquire(config, now)

    def _start_renewal(self) -> tuple[_Held, str, Config, float] | None:
        """Under the lock: the held lease to renew without the lock (its renewal is due, it
        is still valid, no other thread renews it), marked as being renewed; None otherwise
        (then `_ensure_lease` does what is needed under the lock)."""
        held = self._held
        now = self._monotonic()
        if (
            held is None
            or self._renewing is not None
            or now < held.renew_due
            or now >= held.valid_until
            or held.database != leases.database_key()
        ):
            return None
        self._renewing = held
        return held, self._last_ts(), self._config(), now

    def _renew_unlocked(self, held: _Held, last_ts: str, config: Config, now: float) -> None:
        """Renew `held` on the lease's own connection without the mint lock, then record
        the outcome under it (unless the lease was replaced meanwhile)."""
        failure: DatabaseError | None = None
        renewed = False
        try:
            renewed = leases.lease_renew(
                slot=held.lease.slot, token=held.lease.token, last_ts=last_ts, ttl=config.lease_ttl
            )
        except DatabaseError as exc:
            failure = exc
        except BaseException:
            with self._lock:
                self._renewing = None
            raise
        with self._lock:
            self._renewing = None
            if self._held is not held:
                return
            if failure is not None:
                self._renewal_failed(held, failure)
            else:
                self._renewal_done(held, renewed, now, config)

    def _renewal_done(self, held: _Held, renewed: bool, now: float, config: Config) -> bool:
        """Under the lock: record a renewal's answer; False when the lease was lost."""
        if renewed:
            self._quiet.recovered("renewed again")
            held.renew_due = now + config.renew_interval
            held.valid_until = now + config.lease_ttl
            return True
        logger.warning(
            "Lost the lease on writer slot %s; claiming another",
            held.lease.slot,
            extra={"action": "slot_lost", "slot": held.lease.slot},
        )
        self._held = None
        return False

    def _renewal_failed(self, held: _Held, exc: DatabaseError) -> _Held:
        """Under the lock: a renewal that raised; the lease if still valid, else raises."""
        # Judge validity by the clock *after* the failed try: a renewal that hung (a
        # lock wait, a dead network) may have outlived the lease, and by then the
        # slot can belong to another process (I1). Every try opens a fresh
        # connection, so the next mint after an outage reconnects by itself. The
        # next try waits RENEW_RETRY_SECONDS (it was every 50 ms: ~19 tracebacks a
        # second per process through an outage), but never past the lease's end.
        after = self._monotonic()
        if after < held.valid_until:
            self._quiet.failed(
                exc,
                "writer slot renewal: could not renew slot %s",
                held.lease.slot,
                then="; still valid, retrying",
                extra={"action": "slot_renew_failed", "slot": held.lease.slot},
            )
            held.renew_due = min(after + RENEW_RETRY_SECONDS, held.valid_until)
            return held
        self._quiet.failed(
            exc,
            "writer slot renewal: slot %s expired unrenewed",
            held.lease.slot,
            then="; refusing to mint until a new claim",
            extra={"action": "slot_expired", "slot": held.lease.slot},
        )
        self._held = None
        raise NoWriterSlot(
            f"The lease on writer slot {held.lease.slot} expired and could not be "
            "renewed (database unreachable): refusing to mint"
        ) from None

    def _acquire(self, config: Config, now: float) -> _Held:
        role = config.role
        if role in NO_ROLES:
            raise NoWriterSlot(
                f"CANONICAL_IDS_ROLE={role!r}: this process holds no writer slot and must not "
                "mint canonical ids; set CANONICAL_IDS_ROLE=worker (or its fixed role)"
            )
        if role == WORKER_ROLE:
            slots: tuple[int, ...] = config.pool
        else:
            slots = (config.fixed_slots[role],)
        holder = leases.Holder.current(role, self._started_at)
        lease = leases.lease_acquire(slots=slots, holder=holder, ttl=config.lease_ttl)
        floor = max(
            self._ts.last if self._ts else 0, parse_ts(lease.last_ts) if lease.last_ts else 0
        )
        self._ts = TsMinter(
            lease.slot,
            modulus=config.modulus,
            floor=floor,
            time_source=self._time,
            sleep=self._sleep,
        )
        self._held = _Held(
            lease=lease,
            renew_due=now + config.renew_interval,
            valid_until=now + config.lease_ttl,
            database=leases.database_key(),
        )
        self._start_renewer(config)
        return self._held

    def _start_renewer(self, config: Config) -> None:
        if not self._renew_on_timer:
            return
        if self._renewer is not None and self._renewer.is_alive():
            return
        self._renewer = threading.Thread(
            target=_renew_on_timer,
            args=(self, config.renew_interval),
            name=f"canonical-ids-lease-renewer-{os.getpid()}",
            daemon=True,
        )
        self._renewer.start()


def _renew_on_timer(minter: ProcessMinter, interval: float) -> None:
    """Renew `minter`'s lease whenever it is due, until it holds none (issue 20).

    Before this a lease was renewed only on a mint, so a worker that minted nothing for a
    lease's length lost its slot while alive: the admin showed "0 held", another process
    could take the slot. The renewal opens its own connection (canonical_ids.leases), so it
    never touches the thread that mints. A failed renewal is logged by `_ensure_lease`; once
    the lease has run out, the next mint claims again.
    """
    wait = interval
    while True:
        time.sleep(min(max(wait, 0.05), interval))
        try:
            wait = minter.renew_if_due()
        except NoWriterSlot:
            continue  # logged where it was raised; the next call finds nothing held and ends
        except Exception as exc:  # noqa: BLE001 - the renewal loop's one catch-all: log, try again next beat
            minter._quiet.failed(
                exc,
                "writer slot renewal: the timed renewal failed",
                then="; trying again",
                extra={"action": "slot_timer_renew_failed"},
            )
            wait = interval
            continue
        if wait is None:
            return


_minter = ProcessMinter()


def get_minter() -> ProcessMinter:
    return _minter


def mint_ts() -> str:
    """Mint the next id of this process's writer slot (claims a slot on first use)."""
    return _minter.mint()
