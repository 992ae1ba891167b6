"""Handlers the benchmarks' qcluster children load (JOBS_EXTRA_HANDLER_MODULES=bench.handlers)."""

from jobs import handler


@handler("bench.noop", idempotent=True)
def noop(payload: dict) -> None:
    pass


@handler("bench.quick")
def quick(payload: dict) -> None:
    """A 20 ms job (bench/claim_churn.py's mixed workload)."""
    import time

    time.sleep(0.02)


@handler("bench.slow")
def slow(payload: dict) -> None:
    """A 200 ms job: longer than JOBS_HOLD_UNSTARTED_SECONDS (bench/claim_churn.py)."""
    import time

    time.sleep(0.2)


@handler("bench.block_1s", atomic=False)
def block_1s(payload: dict) -> None:
    """Blocks its thread for 1 s, as a blocking HTTP call does (bench/slots.py)."""
    import time

    time.sleep(1)


@handler("bench.query_block_1s", atomic=False)
def query_block_1s(payload: dict) -> None:
    """One query, then blocks its thread for 1 s: an I/O-bound handler that reads a row
    first (bench/connections.py --querying: the connections its slots open)."""
    import time

    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    time.sleep(1)


@handler("bench.async_sleep_1s")
async def async_sleep_1s(payload: dict) -> None:
    """Awaits 1 s, as an async HTTP call does (bench/slots.py)."""
    import asyncio

    await asyncio.sleep(1)


@handler("bench.rated_20", rate="20/s")
def rated_20(payload: dict) -> None:
    """A no-op limited to 20 starts a second for the whole deployment (bench/rates.py)."""


@handler("bench.wait_for_stop", atomic=False, timeout=120)
def wait_for_stop(payload: dict, job) -> None:
    """Waits (in its thread) until asked to stop: a cancel (bench/cancel_latency.py)."""
    job.stop_requested.wait(120)


@handler("bench.async_wait_for_stop", atomic=False, timeout=120)
async def async_wait_for_stop(payload: dict) -> None:
    """Awaits until its task is cancelled (bench/cancel_latency.py)."""
    import asyncio

    await asyncio.sleep(120)
