"""A transactional test's flush truncates only the tables the test wrote to (issue 36
point 6: the suite's time budget).

After every `transaction=True` test pytest-django (Django's TransactionTestCase) runs
`flush`: one TRUNCATE of all 45 tables. PostgreSQL gives each table and each of its
indexes (131) a new file and drops the old ones' buffers, whether the table held a row or
not: 0.3 to 0.6 s of wall time per test here, paid by some 900 tests. A table whose main
fork is empty (size 0: nothing was written to it since its last TRUNCATE or its creation)
is already what TRUNCATE would leave, index included, so only the others are truncated,
with CASCADE so that a table referencing one of them is emptied too (PostgreSQL refuses to
truncate a referenced table alone). The end state is the one a full flush leaves: every
table empty, with no dead rows. Sequences are not restarted by the teardown flush
(`reset_sequences=False`); a flush that asks for it gets the full statement. Installed by
tests/conftest.py in the test process only.
"""

from __future__ import annotations

from typing import Any

_TABLES_WITH_A_PAGE = """
SELECT name FROM unnest(%s::text[]) AS name
WHERE to_regclass(quote_ident(name)) IS NULL
   OR pg_relation_size(to_regclass(quote_ident(name))) > 0
"""


def install() -> None:
    from django.db.backends.postgresql.operations import DatabaseOperations

    full_flush = DatabaseOperations.sql_flush
    if getattr(full_flush, "quick", False):
        return

    def sql_flush(
        self: Any,
        style: Any,
        tables: list[str],
        *,
        reset_sequences: bool = False,
        allow_cascade: bool = False,
    ) -> list[str]:
        if tables and not reset_sequences:
            with self.connection.cursor() as cursor:
                cursor.execute(_TABLES_WITH_A_PAGE, [list(tables)])
                written = [name for (name,) in cursor.fetchall()]
            if written:
                return full_flush(self, style, written, allow_cascade=True)
        return full_flush(
            self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
        )

    sql_flush.quick = True  # type: ignore[attr-defined]
    DatabaseOperations.sql_flush = sql_flush  # type: ignore[method-assign]
