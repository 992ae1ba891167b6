"""Models of the inbound_email app."""

from django.db import models  # noqa: F401
