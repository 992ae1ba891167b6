"""Which columns of a table an admin page's queries read."""

from __future__ import annotations

import re

from django.db import connection
from django.test.utils import CaptureQueriesContext


def columns_read(client, url: str, table: str, columns: list[str]) -> set[str]:
    """GET `url` and return which of `columns` of `table` any of its SELECTs loaded whole
    (a column read only through a function, e.g. a SUBSTRING for a summary, is not)."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    selects = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
    return {
        column
        for column in columns
        if any(re.search(rf'(?<!\()"{table}"\."{column}"(,| FROM)', sql) for sql in selects)
    }
