"""Claim batches are bounded by payload bytes as well as count (issue 22.7).

A batch of 20 claimed 20 payloads whatever their size: 20 jobs of 4 MB put 80 MB in the
worker at once. The claim stops adding rows once their stored payload size
(`pg_column_size`) would pass JOBS_CLAIM_MAX_BYTES, and always takes the first row, so a job
larger than the bound still runs.
"""

from __future__ import annotations

import secrets

import pytest
from django.db import connection

from jobs import enqueue
from jobs.models import Job
from jobs.runner_step import job_claim_batch, job_runner_step

pytestmark = pytest.mark.django_db

PAYLOAD_CHARS = 300_000  # random hex: stored nearly as large (it hardly compresses)


def _stored_sizes(ids: list[int]) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT sum(pg_column_size(payload)) FROM jobs_job WHERE id = ANY(%s)", [ids]
        )
        return cursor.fetchone()[0] or 0


def _enqueue(n: int, chars: int) -> list[int]:
    return [enqueue("bytes.test", {"blob": secrets.token_hex(chars // 2)}).pk for _ in range(n)]


def test_a_batch_stops_before_its_payloads_pass_the_byte_bound(settings):
    settings.JOBS_CLAIM_MAX_BYTES = 1_000_000
    ids = _enqueue(5, PAYLOAD_CHARS)

    first = job_claim_batch(worker="w1", limit=20)
    assert len(first) == 3  # 3 × ~300 kB fit in 1 MB, a 4th would not
    assert _stored_sizes([job.id for job in first]) <= 1_000_000
    assert Job.objects.filter(status=Job.Status.QUEUED).count() == 2

    second = job_claim_batch(worker="w2", limit=20)
    assert sorted(job.id for job in first + second) == sorted(ids)


def test_a_job_larger_than_the_bound_is_still_claimed_alone(settings):
    settings.JOBS_CLAIM_MAX_BYTES = 100_000
    big = _enqueue(1, PAYLOAD_CHARS)
    small = _enqueue(1, 100)

    assert [job.id for job in job_claim_batch(worker="w1", limit=20)] == big
    assert [job.id for job in job_claim_batch(worker="w1", limit=20)] == small


def test_small_payloads_are_bounded_by_count_alone(settings):
    settings.JOBS_CLAIM_MAX_BYTES = 1_000_000
    _enqueue(30, 100)
    assert len(job_claim_batch(worker="w1", limit=20)) == 20


def test_the_runners_batch_claim_keeps_the_same_byte_bound(settings):
    """The runner's own statement (job_runner_step) claims batches too since issue 22,
    point 5: the same bound, and a job larger than it still runs, alone."""
    settings.JOBS_CLAIM_MAX_BYTES = 1_000_000
    ids = _enqueue(5, PAYLOAD_CHARS)

    first = job_runner_step(worker="w1", claim=20).claimed
    assert len(first) == 3
    assert _stored_sizes([job.id for job in first]) <= 1_000_000
    second = job_runner_step(worker="w2", claim=20).claimed
    assert sorted(job.id for job in first + second) == sorted(ids)

    settings.JOBS_CLAIM_MAX_BYTES = 100_000
    big = _enqueue(1, PAYLOAD_CHARS)
    assert [job.id for job in job_runner_step(worker="w3", claim=20).claimed] == big
