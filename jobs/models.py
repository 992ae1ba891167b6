"""Models of the jobs app."""

from django.db import models  # noqa: F401
