"""Metric label values from bounded sets (issue 19.9).

A label value that comes from a row (a job's kind, a status) is a series per distinct value:
20,000 inserted kinds would be 20,000 series in every scrape and in Prometheus. So a label
is either a value the code knows (a kind with a registered handler, a status of the model's
choices) or OTHER. Use these for every label of /metrics that a row can influence.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from jobs.registry import registered_kinds

OTHER = "other"


def bounded(value: str, known: Collection[str]) -> str:
    return value if value in known else OTHER


def job_kinds() -> frozenset[str]:
    """The job kinds registered in code (handlers discovered in this process)."""
    return frozenset(registered_kinds())


def fold(counts: Mapping[str, int], known: Collection[str]) -> dict[str, int]:
    """`counts` with every key outside `known` added up under OTHER."""
    folded: dict[str, int] = {}
    for key, n in counts.items():
        label = bounded(key, known)
        folded[label] = folded.get(label, 0) + n
    return folded
