"""QuietLog / QuietFilter: an outage is one line, a count per 30 s, and one line when it ends
(invariant I24, STYLE.md point 7)."""

from __future__ import annotations

import logging

import psycopg
import pytest
from django.db import OperationalError

from project.quiet_log import QuietFilter, QuietLog
from tests.support.clock import FakeClock


def _lost() -> OperationalError:
    """What Django raises when the server refuses the connection."""
    try:
        psycopg.connect("host=127.0.0.1 port=1 dbname=x connect_timeout=2")
    except psycopg.OperationalError as exc:
        try:
            raise OperationalError(str(exc)) from exc
        except OperationalError as wrapped:
            return wrapped
    raise AssertionError("port 1 answered")


@pytest.fixture
def log():
    logger = logging.getLogger("tests.quiet")
    logger.setLevel(logging.INFO)
    yield logger
    logger.setLevel(logging.NOTSET)


def test_an_outage_is_one_line_then_a_count_per_interval_then_one_line_back(log, caplog):
    clock = FakeClock()
    quiet = QuietLog(log, "job drain", clock=lambda: clock.mono)
    error = _lost()
    with caplog.at_level(logging.INFO, logger="tests.quiet"):
        for _ in range(16 * 60 + 1):  # 16 failures a second for a minute
            quiet.failed(error, "job drain: database connection lost", then="; reconnecting")
            clock.mono += 1 / 16
        quiet.recovered()
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 4, lines  # the first, two counts (at 30 s and 60 s), the recovery
    assert lines[0].startswith("job drain: database connection lost (OperationalError: ")
    assert lines[0].endswith("; reconnecting")
    assert lines[1].endswith("; reconnecting; 479 more in the last 30 s (failing for 30 s)")
    assert lines[2].endswith("; reconnecting; 479 more in the last 30 s (failing for 60 s)")
    assert lines[3] == "job drain: working again after 961 failed tries in 60 s"
    assert all(record.exc_info is None for record in caplog.records)  # expected: no traceback
    assert [record.levelname for record in caplog.records] == ["WARNING"] * 3 + ["INFO"]
    assert caplog.records[1].repeats == 479 and caplog.records[1].loop == "job drain"


def test_an_unexpected_error_has_its_traceback_once(log, caplog):
    clock = FakeClock()
    quiet = QuietLog(log, "mail poll", clock=lambda: clock.mono)
    with caplog.at_level(logging.INFO, logger="tests.quiet"):
        for _ in range(100):
            try:
                {}["missing"]
            except KeyError as exc:
                quiet.failed(exc, "mail poll failed")
            clock.mono += 1
    assert [bool(record.exc_info) for record in caplog.records] == [True, False, False, False]
    assert caplog.records[0].levelname == "ERROR"


def test_at_debug_every_line_has_its_traceback(log, caplog):
    clock = FakeClock()
    quiet = QuietLog(log, "beacon", clock=lambda: clock.mono)
    log.setLevel(logging.DEBUG)
    with caplog.at_level(logging.DEBUG, logger="tests.quiet"):
        for _ in range(3):
            quiet.failed(_lost(), "beacon: beat failed")
            clock.mono += 31
    assert len(caplog.records) == 3 and all(record.exc_info for record in caplog.records)


def test_no_recovery_line_without_a_failure(log, caplog):
    quiet = QuietLog(log, "sweep")
    with caplog.at_level(logging.INFO, logger="tests.quiet"):
        quiet.recovered()
    assert caplog.records == []


def test_the_filter_quiets_django_q_lines_about_a_lost_connection(caplog):
    """django-q2's pusher and scheduler log each failed poll with a traceback."""
    handler = logging.Handler()
    seen: list[logging.LogRecord] = []
    handler.emit = seen.append
    handler.addFilter(QuietFilter())
    logger = logging.getLogger("django-q")
    logger.addHandler(handler)
    try:
        error = _lost()
        for _ in range(50):
            try:
                raise error
            except OperationalError:
                logger.error("Failed to pull task from broker", exc_info=True)
        logger.info("Process-1 processing task ok")
        logger.error('connection failed: connection to server at "127.0.0.1", port 5432 failed')
        logger.error('connection failed: connection to server at "127.0.0.1", port 5432 failed')
    finally:
        logger.removeHandler(handler)
    messages = [record.getMessage() for record in seen]
    assert messages == [
        "Failed to pull task from broker",
        "Process-1 processing task ok",
        'connection failed: connection to server at "127.0.0.1", port 5432 failed',
    ]
    assert seen[0].exc_info is None
