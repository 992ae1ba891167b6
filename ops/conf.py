"""The settings the ops app reads, in one place (validated, each error naming the variable).

ops is the glue of the other apps (schedules, status, the demo): what it shows of another
app's configuration it reads through that app's conf where one exists (EMAIL_SENDER through
notifications.conf, INBOUND_EMAIL_STORE through inbound_email.conf).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

CONSOLE_EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"


@dataclass(frozen=True)
class Config:
    var_dir: Path  # WORKER_VAR_DIR: where the demo writes its mail when email is console
    email_backend: str  # Django's EMAIL_BACKEND (the demo swaps console for files)


def _str(name: str, default: str) -> str:
    value = getattr(settings, name, default)
    if not isinstance(value, str) or not value:
        raise ImproperlyConfigured(f"{name}={value!r} must be a non-empty string")
    return value


@cache  # cleared whenever a setting changes (override_settings, pytest's settings fixture)
def get_config() -> Config:
    var_dir = getattr(settings, "VAR_DIR", None)
    if not isinstance(var_dir, str | Path) or not str(var_dir):
        raise ImproperlyConfigured(f"VAR_DIR={var_dir!r} (from WORKER_VAR_DIR) must be a path")
    return Config(
        var_dir=Path(var_dir),
        email_backend=_str("EMAIL_BACKEND", CONSOLE_EMAIL_BACKEND),
    )


@receiver(setting_changed)
def _forget_config(**kwargs: Any) -> None:
    get_config.cache_clear()
