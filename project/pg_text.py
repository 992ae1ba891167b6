"""Text a PostgreSQL text column can hold, one way everywhere.

PostgreSQL refuses the NUL character in text: an INSERT or UPDATE carrying one fails, and
where that write records an outcome (a job's failure, a mail's store key) the failure used to
take the whole drain or poll down with it. Each NUL is written as the four characters `\\x00`
instead, so what was there stays visible to an operator.
"""

from __future__ import annotations


def without_nul(text: str) -> str:
    """`text` with each NUL written as `\\x00`."""
    return text.replace("\x00", "\\x00")
