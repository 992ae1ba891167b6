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
(`reset_sequences=False`); a flush that asks for it gets the full statement.

The flush then sends post_migrate, whose receivers (contenttypes' and auth's: no other
installed app has one) insert the content types and permissions the TRUNCATE deleted:
about 90 ms of CPU in the test process per flush. Where those two tables hold exactly the
rows the last such post_migrate left (same ids, names and codenames: a fingerprint of both,
taken after it), they are kept and post_migrate is not sent: the database ends as a full
flush would leave it, but for the ids, which then stay the same. Any other content of the
two tables (a test added, changed or deleted a row) gets the full flush and post_migrate
(tests/project/test_quick_flush.py). Installed by tests/conftest.py in the test process
only.
"""

from __future__ import annotations

from typing import Any

# The tables post_migrate fills, and how their content is recognised.
_REFILLED = ("django_content_type", "auth_permission")
_FINGERPRINT = """
SELECT md5(
    coalesce((SELECT string_agg(concat_ws(',', id, app_label, model), ';' ORDER BY id)
              FROM django_content_type), '')
    || '|' ||
    coalesce((SELECT string_agg(concat_ws(',', id, name, content_type_id, codename), ';'
                                ORDER BY id)
              FROM auth_permission), '')
)
"""
_settled: dict[str, str] = {}  # database name -> fingerprint left by its last post_migrate
_keep: set[str] = set()  # databases whose flush in progress kept the two tables

_TABLES_WITH_A_PAGE = """
SELECT name FROM unnest(%s::text[]) AS name
WHERE to_regclass(quote_ident(name)) IS NULL
   OR pg_relation_size(to_regclass(quote_ident(name))) > 0
"""


def _fingerprint(connection: Any) -> str:
    with connection.cursor() as cursor:
        cursor.execute(_FINGERPRINT)
        return cursor.fetchone()[0]


def install() -> None:
    from django.core.management.commands import flush
    from django.db import connections
    from django.db.backends.postgresql.operations import DatabaseOperations

    full_flush = DatabaseOperations.sql_flush
    if getattr(full_flush, "quick", False):
        return
    emit_post_migrate = flush.emit_post_migrate_signal

    def emit_post_migrate_signal(verbosity: int, interactive: bool, db: str) -> None:
        connection = connections[db]
        name = connection.settings_dict["NAME"]
        if name in _keep:
            _keep.discard(name)
            return
        emit_post_migrate(verbosity, interactive, db)
        _settled[name] = _fingerprint(connection)

    def sql_flush(
        self: Any,
        style: Any,
        tables: list[str],
        *,
        reset_sequences: bool = False,
        allow_cascade: bool = False,
    ) -> list[str]:
        name = self.connection.settings_dict["NAME"]
        _keep.discard(name)
        if tables and not reset_sequences:
            with self.connection.cursor() as cursor:
                cursor.execute(_TABLES_WITH_A_PAGE, [list(tables)])
                written = [table for (table,) in cursor.fetchall()]
            if (
                set(_REFILLED) <= set(tables)
                and name in _settled
                and _fingerprint(self.connection) == _settled[name]
            ):
                written = [table for table in written if table not in _REFILLED]
                _keep.add(name)
                if not written:
                    return []  # nothing to empty; the flush sends no post_migrate then
            if written:
                return full_flush(self, style, written, allow_cascade=True)
            _keep.discard(name)
        return full_flush(
            self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
        )

    sql_flush.quick = True  # type: ignore[attr-defined]
    DatabaseOperations.sql_flush = sql_flush  # type: ignore[method-assign]
    flush.emit_post_migrate_signal = emit_post_migrate_signal
