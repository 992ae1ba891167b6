"""EMAIL_SENDER picks the sender class the way EMAIL_BACKEND picks Django's mail backend: an
alias ('django', 'ses') or a dotted path; anything else stops start-up naming the variable."""

from __future__ import annotations

import subprocess

import pytest
from django.core import mail
from django.core.exceptions import ImproperlyConfigured

from notifications.models import EmailNotification
from notifications.senders import get_sender, sender_class
from notifications.senders.base import OutgoingEmail, SendError
from notifications.senders.django import DjangoEmailSender
from notifications.senders.ses import SesEmailSender
from notifications.sweeps import sweep_new_proposals
from tests.support.processes import child_env, manage_py
from tests.support.silent_server import SilentServer
from tests.support.threads import run_side_by_side

Status = EmailNotification.Status


@pytest.mark.django_db
def test_a_dotted_path_chooses_the_sender_that_sends_the_sweep(make_pi, ses, settings):
    settings.EMAIL_SENDER = "notifications.senders.ses.SesEmailSender"
    pi = make_pi()
    assert isinstance(get_sender(), SesEmailSender)

    assert sweep_new_proposals().sent == 1
    assert ses.recipients() == [pi.email]  # SES carried it, not Django's backend
    assert mail.outbox == []
    assert EmailNotification.objects.get(user=pi).ses_message_id == ses.messages[0].id


@pytest.mark.django_db
def test_a_dotted_path_to_the_django_sender_uses_the_email_backend(make_pi, settings):
    settings.EMAIL_SENDER = "notifications.senders.django.DjangoEmailSender"
    pi = make_pi()
    assert sweep_new_proposals().sent == 1
    assert [m.to for m in mail.outbox] == [[pi.email]]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("django", DjangoEmailSender), ("SES", SesEmailSender), (" ses ", SesEmailSender)],
)
def test_aliases_are_case_insensitive(settings, value, expected):
    settings.EMAIL_SENDER = value
    assert sender_class() is expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("smtp", "EMAIL_SENDER='smtp' is not a sender"),
        ("", "EMAIL_SENDER='' is not a sender"),
        ("notifications.senders.postmark.PostmarkSender", "EMAIL_SENDER=.* cannot be imported"),
        ("notifications.conf.get_config", "EMAIL_SENDER=.* is not a sender class"),
        ("notifications.senders.base.MessageId", "EMAIL_SENDER=.* is not a sender class"),
    ],
)
def test_an_unknown_sender_is_a_configuration_error_naming_the_variable(settings, value, message):
    settings.EMAIL_SENDER = value
    with pytest.raises(ImproperlyConfigured, match=message):
        get_sender()


def _django_setup(**env: str) -> subprocess.CompletedProcess:
    return manage_py("check", env=child_env(**env), timeout=60)


@pytest.mark.django_db
def test_an_unknown_sender_stops_start_up():
    result = _django_setup(EMAIL_SENDER="smtp")
    assert result.returncode != 0
    assert "EMAIL_SENDER='smtp' is not a sender" in result.stderr

    result = _django_setup(EMAIL_SENDER="notifications.senders.postmark.PostmarkSender")
    assert result.returncode != 0
    assert "EMAIL_SENDER='notifications.senders.postmark.PostmarkSender' cannot be imported" in (
        result.stderr
    )

    # (with a region: SES without one is a start-up error of its own, notifications.E001)
    result = _django_setup(
        EMAIL_SENDER="notifications.senders.ses.SesEmailSender", SES_REGION="eu-west-1"
    )
    assert result.returncode == 0, result.stderr


def test_ses_that_drops_every_connection_is_a_send_error_after_three_tries(aws_env, monkeypatch):
    """Each send is bounded: botocore's standard retry tries 3 times in all (docs say so;
    `max_attempts` would have meant 3 retries, 4 tries), then the row goes back to pending."""
    with SilentServer(hang_up=True) as server:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)
        sender = SesEmailSender(configuration_set="")
        with pytest.raises(SendError):
            sender.send(_outgoing())
        assert server.connections == 3


@pytest.mark.slow
def test_an_smtp_server_that_never_answers_is_a_send_error_not_a_hang(settings):
    """With EMAIL_BACKEND set to SMTP, Django's EMAIL_TIMEOUT defaulted to None: a server that
    took the connection and never answered held the sweep (and its advisory lock) until the
    task was killed. The shipped settings (no override here) now bound it (EMAIL_TIMEOUT,
    20 s) and a hung server is a SendError."""
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    with SilentServer() as server:
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", server.port
        # A hang guard, not a timing assertion: still running after 90 s is a TimeoutError.
        errors = run_side_by_side(
            lambda: DjangoEmailSender().send(_outgoing()), copies=1, timeout=90
        )
    assert len(errors) == 1 and isinstance(errors[0], SendError), errors


def _outgoing() -> OutgoingEmail:
    return OutgoingEmail(
        to="pi@example.org",
        subject="s",
        text="t",
        html="",
        reply_to="reply@example.org",
        from_email="noreply@example.org",
    )
