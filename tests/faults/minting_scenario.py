"""Minting canonical ids under faults, while the writer-slot lease is renewed.

The pass mints 8 ids, 50 ms apart, with a 1 s lease renewed every 0.2 s (on a mint when
due, and by the timer thread), so claims and renewals of the lease interleave with the
mints on their own connections; each id is stored as a Message (the inbox's table) and
appended with its lease's slot to a file as soon as it is minted. Recovery is a fresh
process minting 6 more. Invariants (I1, I2): no id minted twice, whoever minted it, and
every id in the residue class of the slot its process held (a worker-pool slot).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from django.db import DatabaseError

from canonical_ids import record_message
from canonical_ids.conf import get_config
from canonical_ids.exceptions import NoWriterSlot
from canonical_ids.minter import get_minter, parse_ts
from tests.support.fault_harness import Scenario


class Minting(Scenario):
    name = "minting"
    settings = {
        "CANONICAL_IDS_ROLE": "worker",
        "CANONICAL_IDS_LEASE_TTL": 1.0,
        "CANONICAL_IDS_RENEW_INTERVAL": 0.2,
    }

    def setup(self, workdir: Path) -> dict[str, Any]:
        return {"log": str(workdir / "minted.log")}

    def run(self, ctx: dict[str, Any]) -> None:
        self._mint(ctx, 8)

    def recover(self, ctx: dict[str, Any]) -> None:
        self._mint(ctx, 6)

    @staticmethod
    def _mint(ctx: dict[str, Any], count: int) -> None:
        minter = get_minter()
        minted = 0
        deadline = time.monotonic() + 20
        while minted < count and time.monotonic() < deadline:
            try:
                ts, slot, _token = minter.mint_with_lease()
            except (NoWriterSlot, DatabaseError) as exc:  # the next mint claims or renews again
                print(f"mint failed: {exc!r}", flush=True)
                time.sleep(0.05)
                continue
            fd = os.open(ctx["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(fd, f"{ts} {slot} {os.getpid()}\n".encode())
            os.close(fd)
            minted += 1
            try:
                record_message(run_id="faults", text=f"id {minted}", author="w", source="worker")
            except DatabaseError as exc:  # the id is minted; its row may not be
                print(f"record failed: {exc!r}", flush=True)
            time.sleep(0.05)
        minter.release()

    def check(self, ctx: dict[str, Any], *, killed_pid: int | None) -> list[str]:
        config = get_config()
        try:
            lines = [line.split() for line in Path(ctx["log"]).read_text().splitlines()]
        except FileNotFoundError:
            lines = []
        violations = []
        counts = Counter(ts for ts, _slot, _pid in lines)
        violations += [f"id {ts} minted {n} times" for ts, n in counts.items() if n > 1]
        for ts, slot, pid in lines:
            if parse_ts(ts) % config.modulus != int(slot) or int(slot) not in config.pool:
                violations.append(f"id {ts} (pid {pid}) outside its slot {slot}")
        recovered = [line for line in lines if int(line[2]) != killed_pid]
        if len(lines) < 6 or not recovered:
            violations.append(f"only {len(lines)} ids minted")
        return violations


MINTING = Minting()
