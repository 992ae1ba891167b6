"""Models of the canonical_ids app."""

from django.db import models  # noqa: F401
