"""Reading settings from the environment with errors that name the variable.

django-environ does the parsing; this wrapper only turns its ValueError /
ImproperlyConfigured into one message that says which variable is wrong and
what was expected, so a typo in an env file fails at start-up, not at 3 a.m.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import environ
from django.core.exceptions import ImproperlyConfigured

env = environ.Env()


def _read(kind: str, reader: Callable[..., Any], name: str, default: Any) -> Any:
    try:
        return reader(name, default=default)
    except (ValueError, TypeError, ImproperlyConfigured) as exc:
        raise ImproperlyConfigured(
            f"Environment variable {name}={env.str(name, default='')!r} is not a valid {kind}: "
            f"{exc}"
        ) from exc


def env_str(name: str, default: str) -> str:
    """An empty value counts as unset, as compose env files often carry `NAME=`."""
    return _read("string", env.str, name, default) or default


def env_bool(name: str, default: bool) -> bool:
    value = env.str(name, default="").strip().lower()
    if value == "":
        return default
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(
        f"Environment variable {name}={value!r} is not a valid boolean: use true/false, "
        "1/0, yes/no or on/off"
    )


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    value = _read("integer", env.int, name, default)
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"Environment variable {name}={value} must be >= {minimum}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    value = _read("number", env.float, name, default)
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"Environment variable {name}={value} must be >= {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    return _read("comma-separated list", env.list, name, default)


def env_db(name: str, default: str) -> dict[str, Any]:
    value = os.environ.get(name, "") or default
    scheme = value.partition("://")[0] if "://" in value else ""
    if not scheme or scheme not in environ.Env.DB_SCHEMES:
        # django-environ would warn in two lines ("Engine not recognized ...", echoing the
        # value, a password included) and then fail on a bare 'ENGINE' (issue 31.7).
        raise ImproperlyConfigured(
            f"{name} is not a valid database URL: use postgres://user:password@host:5432/dbname, "
            "or unset it for the embedded PostgreSQL"
        )
    try:
        config = env.db_url(name, default=default)
        if "." not in config["ENGINE"]:
            raise ValueError(f"unknown scheme {config['ENGINE']!r}")
        # A Unix-socket folder travels %-encoded in the host part (postgres://u@%2Fvar%2Fpg/db).
        config["HOST"] = unquote(config.get("HOST") or "")
        return config
    except (ValueError, KeyError, ImproperlyConfigured) as exc:
        raise ImproperlyConfigured(
            f"Environment variable {name} is not a valid database URL "
            f"(e.g. postgres://user:pass@host:5432/dbname): {exc}"
        ) from exc


def env_proxy_ssl_header(name: str) -> tuple[str, str] | None:
    """`Header-Name:value` as Django's SECURE_PROXY_SSL_HEADER (("HTTP_HEADER_NAME", value));
    empty: None."""
    value = env.str(name, default="").strip()
    if not value:
        return None
    header, sep, expected = value.partition(":")
    header, expected = header.strip(), expected.strip()
    if not sep or not header or not expected or " " in header:
        raise ImproperlyConfigured(
            f"Environment variable {name}={value!r} is not a header and value: use "
            "Header-Name:value, e.g. X-Forwarded-Proto:https"
        )
    return "HTTP_" + header.upper().replace("-", "_"), expected
