"""Hostile input at the new doors of enqueue (issue 38, point 9): each a clear error of the
app's own (`jobs.EnqueueError`) before any statement is sent, nothing written."""

from __future__ import annotations

import math

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import jobs
from jobs import enqueue
from jobs.exceptions import EnqueueError, JobError
from jobs.models import Job

pytestmark = pytest.mark.django_db

TEN_MB = "k" * (10 * 1024 * 1024)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"unique_key": TEN_MB}, "unique_key"),
        ({"unique_key": ""}, "unique_key"),
        ({"unique_key": 42}, "unique_key"),
        ({"unique_key": "a\x00b"}, "NUL"),
        ({"unique_key": "k", "unique_for": 0}, "unique_for"),
        ({"unique_key": "k", "unique_for": -5}, "unique_for"),
        ({"unique_key": "k", "unique_for": math.inf}, "unique_for"),
        ({"unique_key": "k", "unique_for": 10 * 366 * 86400}, "unique_for"),
        ({"unique_key": "k", "unique_for": "60"}, "unique_for"),
        ({"unique_for": 60}, "unique_key"),
        ({"tags": "slack"}, "tags"),
        ({"tags": ["ok", 3]}, "tags"),
        ({"tags": [None]}, "tags"),
        ({"tags": [b"bytes"]}, "tags"),
        ({"tags": [""]}, "tags"),
        ({"tags": ["x" * 101]}, "tags"),
        ({"tags": ["a\x00"]}, "NUL"),
        ({"tags": [str(n) for n in range(51)]}, "tags"),
        ({"meta": ["not", "an", "object"]}, "meta"),
        ({"meta": "proposal=812"}, "meta"),
        ({"meta": {"when": object()}}, "meta"),
        ({"meta": {"ratio": math.nan}}, "meta"),
        ({"meta": {1: "non-string key"}}, "meta"),
        ({"meta": {"big": "x" * (70 * 1024)}}, "meta"),
        ({"meta": {"nul": "a\x00b"}}, "NUL"),
    ],
)
def test_a_hostile_option_is_a_clear_error_and_nothing_is_sent(options, says):
    with CaptureQueriesContext(connection) as queries, pytest.raises(EnqueueError) as raised:
        enqueue("tests.noop", {"n": 1}, **options)
    assert says in str(raised.value)
    assert len(str(raised.value)) < 500  # names the problem, does not echo 10 MB
    assert len(queries) == 0
    assert Job.objects.count() == 0


def test_enqueue_error_is_the_apps_own_and_still_a_value_and_type_error():
    assert issubclass(EnqueueError, JobError)
    assert issubclass(EnqueueError, ValueError) and issubclass(EnqueueError, TypeError)
    assert jobs.EnqueueError is EnqueueError


def test_a_payload_that_is_not_json_is_a_clear_error():
    for payload in ({"when": object()}, {"x": math.nan}, {"s": "a\x00b"}):
        with pytest.raises(EnqueueError):
            enqueue("tests.noop", payload, unique_key="k")
    assert Job.objects.count() == 0
