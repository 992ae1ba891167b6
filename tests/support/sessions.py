"""Another client session on the test database, as the web app, a report or psql would open."""

from __future__ import annotations

import psycopg
from django.db import connection


def other_session(*, application_name: str = "") -> psycopg.Connection:
    """A psycopg connection of its own (not Django's) to the test database; the caller's
    transaction stays open until it commits, rolls back or closes."""
    params = connection.settings_dict
    return psycopg.connect(
        psycopg.conninfo.make_conninfo(
            dbname=params["NAME"],
            user=params.get("USER") or None,
            password=params.get("PASSWORD") or None,
            host=params.get("HOST") or None,
            port=params.get("PORT") or None,
            application_name=application_name or None,
        )
    )
