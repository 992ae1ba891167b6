"""Handlers the benchmarks' qcluster children load (JOBS_EXTRA_HANDLER_MODULES=bench.handlers)."""

from jobs import handler


@handler("bench.noop")
def noop(payload: dict) -> None:
    pass
