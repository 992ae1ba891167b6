import pytest
from django.core.management import call_command
from django_q.models import Schedule

from ops.schedules import SCHEDULES, ensure_schedules

pytestmark = pytest.mark.django_db


def test_setup_schedules_is_idempotent_and_corrects_drift(capsys):
    call_command("setup_schedules")
    assert Schedule.objects.count() == len(SCHEDULES)
    assert "created" in capsys.readouterr().out

    drifted = Schedule.objects.get(name=SCHEDULES[0].name)
    drifted.minutes = 999
    drifted.save()

    counts = ensure_schedules()
    assert counts == {"created": 0, "updated": 1, "unchanged": len(SCHEDULES) - 1}
    assert Schedule.objects.get(name=SCHEDULES[0].name).minutes == SCHEDULES[0].minutes
    assert ensure_schedules()["unchanged"] == len(SCHEDULES)
    assert Schedule.objects.count() == len(SCHEDULES)
