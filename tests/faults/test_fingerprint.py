"""The fault harness's name for a round trip (tests/support/pg_faults.py `fingerprint`)."""

from __future__ import annotations

from tests.support.pg_faults import fingerprint

_STEP = (
    "SELECT * FROM jobs_runner_step_v7({worker}, {done}::bigint[], {mark}, {floor}::timestamptz, "
    "{kinds}::text[], {sync})"
)


def test_one_statement_has_one_name_whatever_values_its_parameters_carry():
    """The harness names a round trip by its statement's fingerprint and, in a later run,
    fires at that name's nth occurrence. psycopg renders each parameter as a literal with a
    type of its own choosing: an empty array bare, `'{7}'::int2[]`, `'{70000}'::int4[]`, None
    as `NULL`, a bool as `true` or `false`. So the runner's one statement had several names,
    and which of them a drain's second step carried depended on timing (whether a claim floor
    was set, whether completions were due): a named case picked in the clean run was "not
    reached" in its faulted run (tests/faults/test_slots_faults.py in CI, 2026-12-08)."""
    values = [  # worker, done, mark, floor, kinds, sync
        ("'vm:1:a'", "'{}'", "NULL", "NULL", "NULL", "false"),
        (
            "'vm:1:a'",
            "'{7,8}'::int2[]",
            "42",
            "'2026-12-08 00:00:00+00:00'::timestamptz",
            "'{a,b}'::text[]",
            "true",
        ),
        ("'vm:2:b'", "'{70000}'::int4[]", "NULL", "NULL", "'{}'", "false"),
    ]
    names = ("worker", "done", "mark", "floor", "kinds", "sync")
    shapes = [_STEP.format(**dict(zip(names, row, strict=True))) for row in values]
    assert len({fingerprint(sql) for sql in shapes}) == 1, [fingerprint(s) for s in shapes]


def test_different_statements_keep_different_names():
    assert fingerprint("SELECT id FROM jobs_job WHERE id = 5") != fingerprint(
        "SELECT id FROM jobs_jobattempt WHERE id = 5"
    )
    assert fingerprint("UPDATE jobs_job SET status = 'queued'") != fingerprint(
        "DELETE FROM jobs_job WHERE status = 'queued'"
    )
