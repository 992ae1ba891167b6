"""SQL aggregates of the ops app's own functions (migration 0005)."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db.models import Aggregate, BigIntegerField


class ArraySum(Aggregate):
    """Element-wise sum of histogram arrays (`ops_array_sum`: an empty array is none yet),
    so a reader sums buckets in the database, not row by row in Python."""

    function = "ops_array_sum"
    output_field = ArrayField(BigIntegerField())
