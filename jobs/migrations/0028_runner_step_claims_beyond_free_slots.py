"""`jobs_runner_step_v7`: a drain with slots may claim past its free thread slots for the
kinds nothing limits (issue 37, point 4: the idempotent no-op's CPU per job).

Each step of the runner's statement costs the server about half a millisecond whatever its
size (its plan's start-up, the table's statement triggers: docs/performance.md), so the
server's CPU per job is that over the jobs a step carries. A drain with slots claimed at
most its free slots (0024): with 10 slots, at most 10 jobs a step, where the one-slot drain
takes a batch of 20 and holds the part it has not started (the keeper gives it back after
JOBS_HOLD_UNSTARTED_SECONDS). v7 is 0027's v6 with one more argument, `p_beyond`: rows of a
thread-slot lane whose kind is not capped, not rate-limited, not one of this process's
reserved kinds and not known to run long (`p_slow_kinds`) may be taken up to `p_beyond`
past the free shared thread slots. They wait unstarted in the drain, as the one-slot
drain's batch does, and are given back the same way. Every other row is placed as v6 places
it: a capped kind still takes at most the smaller of its free units and the free slots
(point 2: no process hoards units it cannot start), a reserved kind its own free slots and
the free shared ones. A row past the free slots is not taken behind a row of a slow kind
(it would wait for that slot); with `p_thread_free` NULL (the one-slot drain) the claim
still ends with the first slow row, as before.

With `p_beyond` 0 it is v6. The function is built from 0027's text by replacing the parts
named below (each replacement checked), so the rest stays the statement 0027 documents.

Expand/contract (I23): v6 stays for the previous release's workers; this release calls v7.
The reverse drops v7.
"""

import importlib

from django.db import migrations

_0027 = importlib.import_module("jobs.migrations.0027_runner_step_one_update")

_PARTS = [
    ("FUNCTION jobs_runner_step_v6(", "FUNCTION jobs_runner_step_v7("),
    (
        "p_thread_free integer, p_async_free integer, p_async_commit boolean",
        "p_thread_free integer, p_async_free integer, p_beyond integer, p_async_commit boolean",
    ),
    # lanes: a lane nothing limits may take p_beyond more than the free slots
    (
        """                coalesce(coalesce(own.free, 0) + CASE WHEN l.kind = ANY(p_async_kinds)
                    THEN p_async_free ELSE p_thread_free END, p_claim)) AS take,""",
        """                coalesce(coalesce(own.free, 0) + CASE WHEN l.kind = ANY(p_async_kinds)
                    THEN p_async_free ELSE p_thread_free END, p_claim)
                -- 0028: past the free slots, for a kind nothing limits (`beyond`)
                + CASE WHEN beyond.ok THEN p_beyond ELSE 0 END) AS take,
            beyond.ok AS beyond,""",
    ),
    (
        """            LEFT JOIN jobs_kindrate AS r ON r.kind = l.kind
        WHERE l.kind NOT IN""",
        """            LEFT JOIN jobs_kindrate AS r ON r.kind = l.kind
            -- 0028: a thread-slot kind not capped, not rate-limited, not reserved here and
            -- not known to run long may be claimed past the free slots (slots given)
            CROSS JOIN LATERAL (SELECT coalesce(p_beyond > 0 AND p_thread_free IS NOT NULL
                AND capped.kind IS NULL AND r.kind IS NULL AND own.kind IS NULL
                AND NOT (l.kind = ANY(coalesce(p_async_kinds, '{}')))
                AND NOT (l.kind = ANY(coalesce(p_slow_kinds, '{}'))), false) AS ok) AS beyond
        WHERE l.kind NOT IN""",
    ),
    (
        "        SELECT r.id, r.kind, r.priority, r.run_after, r.size, r.slow\n        FROM lanes",
        "        SELECT r.id, r.kind, r.priority, r.run_after, r.size, r.slow, lanes.beyond\n"
        "        FROM lanes",
    ),
    (
        """        SELECT d.id, d.kind, d.priority, d.run_after, d.size, d.slow FROM (
            SELECT due.id, due.kind, due.priority, due.run_after, due.size, due.slow,""",
        """        SELECT d.id, d.kind, d.priority, d.run_after, d.size, d.slow, d.beyond FROM (
            SELECT due.id, due.kind, due.priority, due.run_after, due.size, due.slow,
                due.beyond,""",
    ),
    (
        "        SELECT a.id, a.priority, a.run_after, a.size, a.slow,\n",
        "        SELECT a.id, a.priority, a.run_after, a.size, a.slow, a.beyond,\n",
    ),
    # fits: a `beyond` row may come p_beyond past the free shared thread slots; `waits`: it
    # has no free slot to start in
    (
        """        SELECT s.id, s.priority, s.run_after, s.size, s.slow FROM (""",
        """        SELECT s.id, s.priority, s.run_after, s.size, s.slow,
            coalesce(s.shared AND NOT s.in_async AND s.shared_nth > p_thread_free, false)
                AS waits
        FROM (""",
    ),
    (
        """           OR s.shared_nth <= CASE WHEN s.in_async THEN p_async_free ELSE p_thread_free END
""",
        """           OR s.shared_nth <= CASE WHEN s.in_async THEN p_async_free ELSE p_thread_free END
           OR (s.beyond AND s.shared_nth <= p_thread_free + p_beyond)
""",
    ),
    # pick: behind a slow row, no row that would wait (with slots); none at all without
    (
        """            SELECT fits.id, row_number() OVER w AS n,""",
        """            SELECT fits.id, fits.waits, row_number() OVER w AS n,""",
    ),
    (
        "AND r.bytes <= p_max_bytes AND NOT r.behind_slow)",
        "AND r.bytes <= p_max_bytes\n"
        "            AND NOT (r.behind_slow AND (p_thread_free IS NULL OR r.waits)))",
    ),
]


def _v7(text: str) -> str:
    for old, new in _PARTS:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


RUNNER_STEP_V7 = _v7(_0027.RUNNER_STEP_V6_ONE_UPDATE)

DROP_V7 = (
    "DROP FUNCTION IF EXISTS jobs_runner_step_v7(text, bigint[], float8[], bigint, float8, "
    "bigint[], integer, bigint, float8, boolean, text[], timestamptz, text[], integer[], "
    "text[], integer, integer, integer, boolean)"
)


class Migration(migrations.Migration):
    dependencies = [("jobs", "0027_runner_step_one_update")]

    operations = [migrations.RunSQL(RUNNER_STEP_V7, DROP_V7)]
