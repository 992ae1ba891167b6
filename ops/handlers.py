"""Job handlers used by `manage.py demo` (autodiscovered by the jobs registry)."""

from __future__ import annotations

from django.contrib.auth import get_user_model

from jobs import handler


@handler("demo.greet")
def greet(payload: dict) -> None:
    """A job that succeeds."""
    get_user_model().objects.filter(username=payload["username"]).update(
        first_name=payload.get("first_name", "Demo")
    )


@handler("demo.duplicate_user")
def duplicate_user(payload: dict) -> None:
    """A job whose failure is a database error (the report's COR-17): it inserts a user that
    exists, so the INSERT raises IntegrityError inside the job's transaction. The runner rolls
    back, records the failure and schedules a retry with backoff."""
    get_user_model().objects.create(username=payload["username"])
