"""project/reconnect.py: telling a lost connection from a bad statement; the loop helper."""

from __future__ import annotations

import logging
import threading

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, OperationalError, connection, connections, transaction

from project.reconnect import Reconnect, connection_lost, service_loop

pytestmark = pytest.mark.django_db(transaction=True)


def _terminate_this_session() -> None:
    pid = connection.connection.info.backend_pid
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()


def _error_of(statement: str) -> DatabaseError:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement)
    except DatabaseError as exc:
        return exc
    raise AssertionError("the statement did not fail")


def test_a_terminated_session_is_a_lost_connection():
    connection.ensure_connection()
    _terminate_this_session()
    error = _error_of("SELECT 1")
    assert isinstance(error, OperationalError)
    assert connection_lost(error)


def test_a_statement_timeout_or_a_bad_statement_is_not():
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = 50")
    try:
        timeout = _error_of("SELECT pg_sleep(1)")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET statement_timeout = 0")
    assert isinstance(timeout, OperationalError)  # QueryCanceled, SQLSTATE 57014
    assert not connection_lost(timeout)
    assert not connection_lost(_error_of("SELECT * FROM no_such_table"))


def test_service_loop_survives_a_lost_connection_logs_it_and_goes_on(caplog):
    """The loop of the commands: a pass that dies with the connection is retried after a
    logged backoff on a fresh connection; the loop ends when `stop` is set."""
    stop = threading.Event()
    passes: list[int] = []

    def step() -> int:
        if len(passes) == 1:
            passes.append(0)
            _terminate_this_session()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            passes.append(cursor.fetchone()[0])
        if len(passes) >= 4:
            stop.set()
        return 0

    with caplog.at_level(logging.INFO, logger="project.reconnect"):
        service_loop(
            step,
            what="test loop",
            stop=stop,
            idle_seconds=lambda _: 0,
            reconnect=Reconnect("test loop", base=0.01, cap=0.05),
        )

    first, _, second, third = passes
    assert first != second == third  # a new session after the loss, then kept
    actions = [record.action for record in caplog.records]
    assert actions == ["db_reconnect", "db_reconnected"]


def test_service_loop_ends_on_a_configuration_error():
    def step() -> None:
        raise ImproperlyConfigured("SLACK_API_URL is not a URL")

    with pytest.raises(ImproperlyConfigured):
        service_loop(step, what="test loop", stop=threading.Event(), idle_seconds=lambda _: 0)
