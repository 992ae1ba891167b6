"""Issue 23.1: sending keeps to the account's rate and pauses for its daily quota.

Against SesLimits (tests/support/ses_limits.py), a local SES that enforces a token bucket and
a daily quota and answers over them as SES does (`Throttling`, "Maximum sending rate
exceeded." / "Daily message quota exceeded.").
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone

from notifications.models import EmailNotification, SendingState
from notifications.pacing import Pacer, take_send_slot
from notifications.senders.base import OutgoingEmail, SendQuotaExceeded, SendThrottled
from notifications.senders.ses import SesEmailSender
from notifications.sweeps import sweep_new_proposals
from tests.support.processes import PROJECT_ROOT, communicate_all
from tests.support.ses_limits import SesLimits
from tests.support.threads import run_side_by_side

Status = EmailNotification.Status


@pytest.fixture
def ses_at(aws_env: None, monkeypatch: pytest.MonkeyPatch, settings) -> Iterator[type]:
    """Start a SesLimits with the given limits; boto3 talks to it (EMAIL_SENDER=ses). The rate
    is the account's (GetSendQuota), not the test suite's override."""
    settings.EMAIL_SENDER = "ses"
    settings.NOTIFICATION_SEND_RATE = 0
    started: list[SesLimits] = []

    def start(**limits: object) -> SesLimits:
        ses = SesLimits(**limits).__enter__()
        started.append(ses)
        monkeypatch.setenv("AWS_ENDPOINT_URL", ses.url)
        return ses

    yield start  # type: ignore[misc]
    for ses in started:
        ses.__exit__(None, None, None)


def _outgoing() -> OutgoingEmail:
    return OutgoingEmail(
        to="pi@example.org",
        subject="s",
        text="t",
        html="",
        reply_to="reply@example.org",
        from_email="assistant@localhost",
    )


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_due_notices_keeps_to_the_rate_ses_reports(make_pi, ses_at):
    """Unpaced, 30 notices against 20/s drew Throttling answers (botocore retried them, and
    some burned attempts). Paced to GetSendQuota's MaxSendRate: none throttled, all sent."""
    ses = ses_at(rate=20)
    pis = [make_pi() for _ in range(30)]

    summary = sweep_new_proposals(now=timezone.now())

    assert ses.quota_calls >= 1  # the rate came from GetSendQuota
    assert (summary.sent, summary.failed, summary.throttled) == (30, 0, 0)
    assert ses.throttled_rate == 0
    assert sorted(ses.recipients()) == sorted(pi.email for pi in pis)
    state = SendingState.objects.get()
    assert state.max_send_rate == 20.0 and state.quota_checked_at is not None


@pytest.mark.django_db(transaction=True)
def test_the_pace_holds_across_processes_together():
    """Two workers (two database sessions) taking slots at once get slots 1/rate apart between
    them, not each: the bucket is in the database."""
    rate = 50.0
    slots = []
    lock = threading.Lock()

    def take() -> None:
        for _ in range(10):
            slot = take_send_slot(rate)
            with lock:
                slots.append(slot.at)

    assert run_side_by_side(take, copies=2) == []
    slots.sort()
    gaps = [(b - a).total_seconds() for a, b in zip(slots, slots[1:], strict=False)]
    assert len(slots) == 20
    assert min(gaps) >= 1 / rate - 1e-6, gaps


_TAKE_SLOTS = """
import sys

import django

django.setup()
from notifications.pacing import take_send_slot

print("ready", flush=True)
sys.stdin.readline()  # the go: both processes ask at once
for _ in range(int(sys.argv[1])):
    print(take_send_slot(float(sys.argv[2])).at.timestamp(), flush=True)
"""


@pytest.mark.slow  # two Django start-ups, a few seconds
@pytest.mark.django_db(transaction=True)
def test_the_pace_holds_across_two_real_processes(subprocess_env):
    """Issue 28.7: the test above runs two threads of one process, so a bucket kept in the
    process (a module-level "next slot") passed it. Two worker processes, started and then
    told to go at the same moment, take their slots from the one bucket in the database:
    all ten are 1/rate apart, whichever process took them."""
    rate, each = 5.0, 5
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _TAKE_SLOTS, str(each), str(rate)],
            env=subprocess_env,
            cwd=PROJECT_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for child in children:
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
    finally:
        outputs = communicate_all(children, timeout=60)

    slots = []
    for child, (out, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err
        taken = [float(line) for line in out.split()]
        assert len(taken) == each
        slots.extend(taken)
    slots.sort()
    gaps = [b - a for a, b in zip(slots, slots[1:], strict=False)]
    assert min(gaps) >= 1 / rate - 1e-6, gaps


@pytest.mark.django_db(transaction=True)
def test_the_rate_is_read_once_then_cached_and_refreshed(ses_at, settings):
    ses = ses_at(rate=14)
    sender = SesEmailSender()
    assert Pacer(sender).rate() == 14.0
    assert Pacer(sender).rate() == 14.0  # another process: the row's figure, no call
    assert ses.quota_calls == 1
    SendingState.objects.update(quota_checked_at=timezone.now() - timedelta(hours=1))
    assert Pacer(sender).rate() == 14.0
    assert ses.quota_calls == 2


@pytest.mark.django_db(transaction=True)
def test_the_environment_overrides_the_rate(ses_at, settings):
    ses = ses_at(rate=14)
    settings.NOTIFICATION_SEND_RATE = 3.5
    assert Pacer(SesEmailSender()).rate() == 3.5
    assert ses.quota_calls == 0


@pytest.mark.django_db(transaction=True)
def test_ses_answers_over_the_limits_are_told_apart_in_one_call(ses_at):
    """botocore's retry treated both Throttling answers as retryable: three calls each."""
    ses = ses_at(rate=1, burst=1, daily_quota=2)
    sender = SesEmailSender()
    sender.send(_outgoing())
    with pytest.raises(SendThrottled, match="Maximum sending rate exceeded"):
        sender.send(_outgoing())
    assert ses.throttled_rate == 1
    ses.rate = ses.burst = 1000
    sender.send(_outgoing())
    with pytest.raises(SendQuotaExceeded, match="Daily message quota exceeded"):
        sender.send(_outgoing())
    assert ses.throttled_quota == 1


@pytest.mark.django_db(transaction=True)
def test_a_rate_refusal_costs_no_attempt_and_the_mail_goes_out(make_pi, ses_at, settings):
    """Paced above what SES allows (a wrong override): Throttling answers come back, each is
    waited out and tried again; every notice is sent on its first attempt, none fails."""
    ses = ses_at(rate=5, burst=1)
    settings.NOTIFICATION_SEND_RATE = 1000
    settings.NOTIFICATION_THROTTLE_RETRY_SECONDS = 0.2
    for _ in range(6):
        make_pi()

    summary = sweep_new_proposals(now=timezone.now())

    assert ses.throttled_rate > 0 and summary.throttled == ses.throttled_rate
    assert (summary.sent, summary.failed) == (6, 0)
    rows = EmailNotification.objects.all()
    assert {(row.status, row.attempts) for row in rows} == {(Status.SENT, 1)}


@pytest.mark.django_db(transaction=True)
def test_the_daily_quota_pauses_all_sending_and_nothing_fails(make_pi, ses_at, settings):
    """Over the quota, every notice used to end `failed` after 15 SES calls. Now the first
    refusal pauses sending: the rest wait `pending` with no attempt spent, the next sweeps
    call SES for nothing, and when the quota frees they are all sent."""
    ses = ses_at(rate=100, daily_quota=4)
    settings.NOTIFICATION_SEND_PAUSE_SECONDS = 600
    settings.NOTIFICATION_SWEEP_BATCH_SIZE = 5
    pis = [make_pi() for _ in range(10)]
    now = timezone.now()

    first = sweep_new_proposals(now=now)

    assert (first.sent, first.failed) == (4, 0)
    assert ses.throttled_quota == 1  # one refused call, not three per attempt
    rows = EmailNotification.objects.all()
    assert rows.filter(status=Status.SENT).count() == 4
    waiting = rows.filter(status=Status.PENDING)
    assert waiting.count() == 6 and not rows.filter(status=Status.FAILED).exists()
    assert set(waiting.values_list("attempts", flat=True)) == {0}
    state = SendingState.objects.get()
    assert state.paused_until is not None and state.paused_until > now
    assert "Daily message quota exceeded" in state.pause_reason

    calls = ses.calls
    assert sweep_new_proposals(now=now + timedelta(minutes=5)).sent == 0
    assert ses.calls == calls  # paused: SES is not asked to send

    still_spent = sweep_new_proposals(now=state.paused_until + timedelta(seconds=1))
    assert still_spent.sent == 0 and ses.calls == calls  # GetSendQuota said: still spent
    state.refresh_from_db()
    assert state.paused_until > now + timedelta(minutes=10)

    ses.free_quota()
    ses.daily_quota = 100
    later = sweep_new_proposals(now=state.paused_until + timedelta(seconds=1))
    assert (later.sent, later.failed) == (6, 0)
    assert sorted(ses.recipients()) == sorted(pi.email for pi in pis)
    assert SendingState.objects.get().paused_until is None


@pytest.mark.django_db(transaction=True)
def test_a_quota_get_send_quota_shows_spent_holds_without_a_refused_call(make_pi, ses_at):
    """The account already sent its day's quota (another sender, an earlier run): the rate
    read finds it spent, so the sweep holds its claims without asking SES for a refusal."""
    ses = ses_at(rate=100, daily_quota=2)
    sender = SesEmailSender()
    sender.send(_outgoing())
    sender.send(_outgoing())
    for _ in range(3):
        make_pi()

    summary = sweep_new_proposals(now=timezone.now())

    assert (summary.sent, summary.failed, summary.held) == (0, 0, 3)
    assert ses.throttled_quota == 0 and len(ses.accepted) == 2
    assert set(EmailNotification.objects.values_list("status", "attempts")) == {(Status.PENDING, 0)}
    assert "GetSendQuota" in SendingState.objects.get().pause_reason


@pytest.mark.django_db(transaction=True)
def test_a_notice_refused_for_the_rate_every_try_goes_back_unspent_and_never_fails(
    make_pi, ses_at, settings
):
    """Issue 28.7: only the retry loop was exercised. Here SES refuses every try for the rate
    (THROTTLE_TRIES in a row, sweep after sweep, more sweeps than the notice has attempts):
    each time the claim goes back to `pending` with no attempt spent, it never ends
    `failed`, and once the rate frees it is sent on its first attempt."""
    from notifications.sweep_delivery import THROTTLE_TRIES

    ses = ses_at(rate=0.001, burst=0)  # no token for the next 1,000 s: Throttling every time
    settings.NOTIFICATION_SEND_RATE = 1000  # our pace is not the limit; SES's is
    settings.NOTIFICATION_THROTTLE_RETRY_SECONDS = 0.01
    settings.NOTIFICATION_SEND_MAX_ATTEMPTS = 2
    pi = make_pi()
    now = timezone.now()

    for cycle in range(3):
        summary = sweep_new_proposals(now=now + timedelta(minutes=cycle))

        assert (summary.sent, summary.failed, summary.throttled) == (0, 0, THROTTLE_TRIES)
        assert summary.released == 1
        row = EmailNotification.objects.get()
        assert (row.status, row.attempts, row.failure_reason) == (Status.PENDING, 0, "")
        assert f"refused for the sending rate {THROTTLE_TRIES} times in a row" in row.last_error
        assert row.retry_after is not None
    assert ses.throttled_rate == 3 * THROTTLE_TRIES and ses.accepted == []

    ses.rate = ses.burst = 1000
    later = sweep_new_proposals(now=now + timedelta(minutes=5))

    assert (later.sent, later.failed) == (1, 0)
    row = EmailNotification.objects.get()
    assert (row.status, row.attempts) == (Status.SENT, 1)
    assert ses.recipients() == [pi.email]
