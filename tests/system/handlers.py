"""Job handlers for the system test, loaded in the qcluster children via
JOBS_EXTRA_HANDLER_MODULES=tests.system.handlers."""

from __future__ import annotations

import os
import time

from canonical_ids import record_message
from canonical_ids.minter import get_minter
from jobs import handler

SYSTEM_RUN_ID = "system-test-jobs"


@handler("system.record")
def record(payload: dict) -> None:
    """Leave one Message per execution: a duplicate run would show as a second row."""
    time.sleep(payload.get("sleep", 0))
    message = record_message(
        run_id=SYSTEM_RUN_ID,
        text=f"job-{payload['n']}",
        author="system-test",
        source="job",
        metadata={"pid": os.getpid()},
    )
    # The lease the id was minted under (read after minting: the mint may have claimed a new
    # one). A process may hold a slot, lose it while idle, and lease it again later; the
    # chaos test tells those tenures apart by token.
    message.metadata["token"] = get_minter().token
    message.save(update_fields=["metadata"])
