"""The checks of a producer's arguments to `enqueue` and `enqueue_many` (issue 38, point 9).

Each refusal is an `EnqueueError` naming the argument and the rule, raised before any
statement is sent: a hostile value (a key of 10 MB, a tag that is not a string, meta that is
not a JSON object, a payload with NaN or a NUL) is never half-written and never reaches
PostgreSQL as an error the caller has to decode. The bounds are the columns' (a key or a tag
must fit a B-tree entry many times over) or generous ones that keep one row small.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from jobs.exceptions import EnqueueError

MAX_KIND_CHARS = 100  # Job.kind
MAX_UNIQUE_KEY_CHARS = 255  # Job.unique_key
MAX_TAGS = 50
MAX_TAG_CHARS = 100  # Job.tags' elements
MAX_META_BYTES = 64 * 1024  # meta is for finding jobs, not for their data (the payload)
MAX_UNIQUE_FOR = timedelta(days=366)
INT32 = 2**31 - 1

# A NUL in the JSON text json.dumps writes (\u0000 not preceded by an escaping backslash):
# PostgreSQL's jsonb refuses it.
_JSON_NUL = re.compile(r"(?:^|[^\\])(?:\\\\)*\\u0000")


def _fail(message: str) -> EnqueueError:
    return EnqueueError(message)


def _no_nul(name: str, text: str) -> None:
    if "\x00" in text:
        raise _fail(f"{name} must not contain a NUL character (PostgreSQL text refuses it)")


def check_kind(kind: Any) -> str:
    if not isinstance(kind, str) or not kind or len(kind) > MAX_KIND_CHARS:
        raise _fail(f"kind must be a non-empty string of at most {MAX_KIND_CHARS} characters")
    _no_nul("kind", kind)
    return kind


def json_text(name: str, value: Any) -> str:
    """`value` as JSON text PostgreSQL's jsonb accepts, or an EnqueueError naming `name`."""
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:  # not JSON: object(), a set, NaN, a cycle
        raise _fail(f"{name} must be JSON (no NaN or Infinity): {str(exc)[:200]}") from None
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise _fail(f"{name} must not contain a NUL character (\\u0000): jsonb refuses it")
    return text


def check_payload(payload: Any, name: str = "payload") -> tuple[dict[str, Any], str]:
    """The payload (a JSON object) and its JSON text."""
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise _fail(f"job {name} must be a dict, not {type(payload).__name__}")
    return payload, json_text(name, payload)


def check_unique_key(key: Any, name: str = "unique_key") -> str | None:
    if key is None:
        return None
    if not isinstance(key, str):
        raise _fail(f"{name} must be a string, not {type(key).__name__}")
    if not key or len(key) > MAX_UNIQUE_KEY_CHARS:
        raise _fail(
            f"{name} must have 1 to {MAX_UNIQUE_KEY_CHARS} characters, not {len(key)} "
            "(hash a longer one)"
        )
    _no_nul(name, key)
    return key


def check_unique_for(unique_for: Any, *, has_key: bool) -> timedelta | None:
    if unique_for is None:
        return None
    if not has_key:
        raise _fail("unique_for needs a unique_key (it keeps that key after completion)")
    if isinstance(unique_for, timedelta):
        seconds = unique_for.total_seconds()
    elif isinstance(unique_for, int | float) and not isinstance(unique_for, bool):
        seconds = float(unique_for)
    else:
        raise _fail(f"unique_for must be seconds or a timedelta, not {type(unique_for).__name__}")
    limit = MAX_UNIQUE_FOR.total_seconds()
    if not math.isfinite(seconds) or seconds <= 0 or seconds > limit:
        raise _fail(f"unique_for must be more than 0 and at most {limit:.0f} seconds")
    return timedelta(seconds=seconds)


def check_tags(tags: Any) -> list[str] | None:
    """The tags in order without repeats, or None for none (no bytes, no index entry)."""
    if tags is None:
        return None
    if isinstance(tags, str | bytes | dict) or not isinstance(tags, Iterable):
        raise _fail(f"tags must be a list of strings, not {type(tags).__name__}")
    tags = list(tags)
    if len(tags) > MAX_TAGS:
        raise _fail(f"tags: at most {MAX_TAGS}, not {len(tags)}")
    for tag in tags:
        if not isinstance(tag, str):
            raise _fail(f"tags must be strings, not {type(tag).__name__}")
        if not tag or len(tag) > MAX_TAG_CHARS:
            raise _fail(f"tags must have 1 to {MAX_TAG_CHARS} characters, not {len(tag)}")
        _no_nul("a tag", tag)
    return list(dict.fromkeys(tags)) or None


def check_meta(meta: Any) -> dict[str, Any] | None:
    """A JSON object with string keys, or None for none (an empty one is none)."""
    if meta is None:
        return None
    if not isinstance(meta, dict):
        raise _fail(f"meta must be a dict (a JSON object), not {type(meta).__name__}")
    if not all(isinstance(key, str) for key in meta):
        raise _fail("meta's keys must be strings")
    text = json_text("meta", meta)
    if len(text.encode()) > MAX_META_BYTES:
        raise _fail(f"meta must be at most {MAX_META_BYTES} bytes as JSON (the payload holds data)")
    return meta or None


def check_priority(priority: Any) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > INT32:
        raise _fail(f"priority must be a whole number within ±{INT32}")
    return priority


def check_max_attempts(max_attempts: Any) -> int:
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
        raise _fail(f"max_attempts must be a whole number, not {type(max_attempts).__name__}")
    if not 1 <= max_attempts <= INT32:
        raise _fail(f"max_attempts must be >= 1, not {max_attempts}")
    return max_attempts


def check_run_after(run_after: Any) -> datetime | None:
    if run_after is not None and not isinstance(run_after, datetime):
        raise _fail(f"run_after must be a datetime, not {type(run_after).__name__}")
    return run_after
