import pytest
from django.core.management import call_command
from django_q.models import Schedule

from ops.schedules import SCHEDULES, ensure_schedules, unknown_schedules_enabled

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


def test_setup_schedules_disables_unknown_schedules_and_reports_them(capsys):
    """Issue 19.1: schedules come only from code; one added by hand or by SQL is stopped."""
    ensure_schedules()
    hostile = Schedule.objects.create(
        name="hostile", func="os.system", args="'touch /tmp/x'", schedule_type=Schedule.MINUTES
    )
    ours = Schedule.objects.get(name=SCHEDULES[0].name)
    ours.hook = "os.system"
    ours.save()

    call_command("setup_schedules")

    out = capsys.readouterr().out
    assert (
        f"disabled unknown schedule 'hostile' (id {hostile.pk}, func os.system): "
        "schedules come only from code" in out
    )
    assert Schedule.objects.get(pk=hostile.pk).repeats == 0  # django-q2 never runs it again
    assert Schedule.objects.get(pk=ours.pk).hook is None  # our own are corrected
    assert unknown_schedules_enabled() == []
    call_command("setup_schedules")
    assert "disabled" not in capsys.readouterr().out
