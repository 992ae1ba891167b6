"""The caps per job kind reach the database (issue 37, point 2).

`@handler(kind, concurrency=N)` is in code; the claim, which runs in PostgreSQL for every
process and host at once, reads `jobs_kindcap`. Each worker (`qcluster`, `run_jobs`) writes
its registry's caps there at start-up, `kind_caps_sync()`: one statement that inserts the new
caps, corrects the changed ones and removes the rows of kinds its code has no cap for, and
logs what changed. Code is the source: a row an operator or an older release left behind is
replaced at the next start.

Two releases at once (a rolling deploy, I23): the last worker to start writes its release's
caps, and a worker of the previous release (which has no cap sync) leaves the table alone;
docs/operations.md, "Caps per kind during a deploy".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import connection

from jobs import registry
from jobs.kind_settings_report import log_sync, start_line

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CapChange:
    kind: str
    was: int | None  # None: the kind had no cap
    now: int | None  # None: the cap was removed

    def __str__(self) -> str:
        if self.was is None:
            return f"{self.kind} {self.now} (new)"
        if self.now is None:
            return f"{self.kind} removed (was {self.was})"
        return f"{self.kind} {self.now} (was {self.was})"


# One statement, so it commits whole or not at all, and concurrent starts cannot interleave
# half-syncs (the upsert waits on a row another start is writing). All its parts read the
# statement's one snapshot: `before` is the table as it was.
_SYNC_SQL = """
WITH wanted AS (
    SELECT w.kind, w.concurrency FROM unnest(%s::text[], %s::integer[]) AS w(kind, concurrency)
), before AS (
    SELECT c.kind, c.concurrency FROM jobs_kindcap AS c
), removed AS (
    DELETE FROM jobs_kindcap AS c WHERE c.kind NOT IN (SELECT w.kind FROM wanted AS w)
    RETURNING c.kind
), written AS (
    INSERT INTO jobs_kindcap AS c (kind, concurrency, updated_at)
    SELECT w.kind, w.concurrency, now() FROM wanted AS w
    ON CONFLICT (kind) DO UPDATE SET concurrency = excluded.concurrency, updated_at = now()
    WHERE c.concurrency <> excluded.concurrency
    RETURNING c.kind, c.concurrency
)
SELECT w.kind, b.concurrency, w.concurrency FROM written AS w LEFT JOIN before AS b USING (kind)
UNION ALL
SELECT r.kind, b.concurrency, NULL FROM removed AS r LEFT JOIN before AS b USING (kind)
ORDER BY 1
"""


def kind_caps_sync() -> list[CapChange]:
    """Make `jobs_kindcap` what this process's handlers say; return (and log) what changed.

    Called outside any transaction at a worker's start (a database error stops the start,
    as the schedules' sync before it does), and safe to repeat: a second call changes
    nothing.
    """
    caps = registry.kind_caps()
    with connection.cursor() as cursor:  # one statement: one round trip, one commit
        cursor.execute(_SYNC_SQL, [list(caps), list(caps.values())])
        changes = [CapChange(kind, was, now) for kind, was, now in cursor.fetchall()]
    log_sync(logger, "caps", caps, changes)
    return changes


def kind_caps_line(changes: list[CapChange]) -> str:
    """The start-up line of a worker command (beside the schedules')."""
    return start_line("caps", registry.kind_caps(), changes)
