"""Notification senders, chosen by EMAIL_SENDER the way Django chooses its EMAIL_BACKEND.

`base.py` holds the interface (EmailSender, OutgoingEmail, SendError); `django.py` and
`ses.py` the two adapters. This module loads the configured class by its dotted path
(`import_string`), so the adapters never import each other and a third one needs no change
here: EMAIL_SENDER=myproject.senders.Postmark works.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from notifications.conf import get_config
from notifications.senders.base import EmailSender


def sender_class() -> type[EmailSender]:
    """The class EMAIL_SENDER names; ImproperlyConfigured (naming the variable) if it cannot
    be imported or is not a sender. Called at start-up by the AppConfig."""
    config = get_config()
    try:
        cls = import_string(config.email_sender_path)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"EMAIL_SENDER={config.email_sender!r} cannot be imported: {exc}"
        ) from exc
    if not isinstance(cls, type) or not callable(getattr(cls, "send", None)):
        raise ImproperlyConfigured(
            f"EMAIL_SENDER={config.email_sender!r} is not a sender class (it needs a send() "
            "method, see notifications.senders.base.EmailSender)"
        )
    return cls


def get_sender() -> EmailSender:
    """A new sender of the configured class; built per sweep (cheap, and fork-safe)."""
    return sender_class()()
