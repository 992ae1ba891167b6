"""tests/support/quick_flush.py: the flush after a transactional test, cut to the tables
written to and without post_migrate where the content types and permissions are intact,
leaves the database as Django's full flush does (issue 36 point 6)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connection

from jobs import enqueue
from jobs.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def _flush() -> None:
    """As pytest-django's teardown calls it (TransactionTestCase._fixture_teardown)."""
    call_command("flush", verbosity=0, interactive=False, reset_sequences=False)


def _rows() -> dict[str, int]:
    """Every table's row count, the empty ones left out."""
    counts = {}
    with connection.cursor() as cursor:
        for table in connection.introspection.django_table_names(only_existing=True):
            cursor.execute(f'SELECT count(*) FROM "{table}"')
            (count,) = cursor.fetchone()
            if count:
                counts[table] = count
    return counts


def _refilled() -> tuple[list, list]:
    """What post_migrate makes, ids aside."""
    return (
        sorted(ContentType.objects.values_list("app_label", "model")),
        sorted(Permission.objects.values_list("content_type__model", "codename", "name")),
    )


def test_the_flush_leaves_what_a_full_flush_leaves_whatever_the_test_did_to_the_permissions():
    _flush()  # a full one: the fingerprint of what its post_migrate made is taken
    migrated, migrated_rows = _refilled(), _rows()
    assert set(migrated_rows) == {"django_content_type", "auth_permission"}

    enqueue("tests.noop")
    _flush()  # the content types and permissions kept: only the job's tables emptied
    assert (_refilled(), _rows()) == (migrated, migrated_rows)
    assert not Job.objects.exists()

    assert Permission.objects.filter(codename="add_job").delete()[0] == 1
    _flush()  # a permission missing: the full flush and post_migrate make it again
    assert (_refilled(), _rows()) == (migrated, migrated_rows)

    assert Permission.objects.filter(codename="add_job").update(name="renamed") == 1
    _flush()
    assert (_refilled(), _rows()) == (migrated, migrated_rows)

    ContentType.objects.create(app_label="tests", model="made_by_a_test")
    _flush()
    assert (_refilled(), _rows()) == (migrated, migrated_rows)

    _flush()  # nothing written at all
    assert (_refilled(), _rows()) == (migrated, migrated_rows)
