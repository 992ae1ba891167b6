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
    shapes = [
        _STEP.format(
            worker="'vm:1:a'", done="'{}'", mark="NULL", floor="NULL", kinds="NULL", sync="false"
        ),
        _STEP.format(
            worker="'vm:1:a'",
            done="'{7,8}'::int2[]",
            mark="42",
            floor="'2026-12-08 00:00:00+00:00'::timestamptz",
            kinds="'{a,b}'::text[]",
            sync="true",
        ),
        _STEP.format(
            worker="'vm:2:b'",
            done="'{70000}'::int4[]",
            mark="NULL",
            floor="NULL",
            kinds="'{}'",
            sync="false",
        ),
    ]
    assert len({fingerprint(sql) for sql in shapes}) == 1, [fingerprint(s) for s in shapes]


def test_different_statements_keep_different_names():
    assert fingerprint("SELECT id FROM jobs_job WHERE id = 5") != fingerprint(
        "SELECT id FROM jobs_jobattempt WHERE id = 5"
    )
    assert fingerprint("UPDATE jobs_job SET status = 'queued'") != fingerprint(
        "DELETE FROM jobs_job WHERE status = 'queued'"
    )
