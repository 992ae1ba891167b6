"""Issue 28.6: bounce mail is bounded before any bounce detector runs.

A mail from `MAILER-DAEMON@anything` was read as a bounce report whole: flufl.bounce's
detectors scan every line of the body (1.5 MB of blank lines took 43 s in one poll, and
mails up to 10 MB are allowed), the 1 MB text limit was not applied on that path, and
flufl logged about 20 INFO lines per suspected bounce. Now a report is read from its header
block and at most INBOUND_EMAIL_MAX_REPORT_BYTES of its body, under the parsing limits,
and flufl.bounce logs at WARNING only. The time it takes is measured by
bench/bounce_mail.py (10 fake bounces of 10 MB in one poll), never asserted here.
"""

from __future__ import annotations

import logging

import pytest

from inbound_email.delivery_reports import read_delivery_report
from inbound_email.models import InboundEmail
from inbound_email.poller import poll_once

GONE = "gone.pi@example.net"
EXIM_TEXT = (
    "This message was created automatically by mail delivery software.\n\n"
    "A message that you sent could not be delivered to one or more of its\n"
    "recipients. This is a permanent error. The following address(es) failed:\n\n"
    f"  {GONE}\n"
    f"    SMTP error from remote mail server after RCPT TO:<{GONE}>:\n"
    "    550 5.1.1 User unknown\n"
)


def text_bounce(*, blank_lines_before: int = 0, sender: str = "Mailer-Daemon@mx.example.net"):
    """A bounce in a format only flufl.bounce reads (Exim's text, no X-Failed-Recipients),
    from a mailer daemon; `blank_lines_before` pushes the failure notice down the body."""
    return (
        f"From: Mail Delivery System <{sender}>\n"
        "To: replies@reply.example.org\n"
        "Subject: Mail delivery failed: returning message to sender\n"
        "Content-Type: text/plain; charset=us-ascii\n\n" + "\n" * blank_lines_before + EXIM_TEXT
    ).encode()


@pytest.mark.parametrize(
    ("setting", "size"),
    [("INBOUND_EMAIL_MAX_REPORT_BYTES", 4096), ("INBOUND_EMAIL_MAX_BOUNCE_SCAN_BYTES", 4096)],
)
def test_the_detectors_read_only_the_first_bytes_of_the_body(settings, setting, size):
    """Through a real flufl.bounce call: a failure notice within the window is found; the
    same notice past it is never scanned (on main the whole body was)."""
    setattr(settings, setting, size)

    within = read_delivery_report(text_bounce(blank_lines_before=size - 1000))
    past = read_delivery_report(text_bounce(blank_lines_before=size + 1000))

    assert within is not None and [(f.address, f.kind) for f in within.findings] == [
        (GONE, "hard_bounce")
    ]
    assert past is None


def test_a_text_part_over_the_text_limit_is_refused_before_a_detector_runs(settings):
    from inbound_email.exceptions import MailLimitExceeded

    settings.INBOUND_EMAIL_MAX_TEXT_BYTES = 1000

    with pytest.raises(MailLimitExceeded) as refused:
        read_delivery_report(text_bounce(blank_lines_before=2000))

    assert refused.value.reason == "text_size_limit"


@pytest.mark.django_db(transaction=True)
def test_a_fake_bounce_over_the_text_limit_is_quarantined_with_the_limit_never_scanned(
    folder_store, settings
):
    """The text limit applies on the bounce path as on a reply (it did not: the detectors
    ran over the whole text and the mail was rejected as a bounce)."""
    settings.INBOUND_EMAIL_MAX_TEXT_BYTES = 1000
    folder_store.put("fake-bounce", text_bounce(blank_lines_before=2000))

    poll_once()

    mail = InboundEmail.objects.get()
    assert (mail.status, mail.reason) == (InboundEmail.Status.QUARANTINED, "text_size_limit")


@pytest.mark.django_db(transaction=True)
def test_a_10_mb_fake_bounce_is_rejected_on_its_headers_after_a_bounded_read(folder_store, caplog):
    """10 MB of blank lines from MAILER-DAEMON@anything (the size INBOUND_EMAIL_MAX_BYTES
    allows): its report window holds no failure, so it is rejected as a bounce on its
    headers, its body never parsed, and only the first bytes of its raw source are kept."""
    caplog.set_level(logging.INFO)
    raw = text_bounce(blank_lines_before=10 * 1024 * 1024, sender="MAILER-DAEMON@attacker.example")
    raw = raw[: 10 * 1024 * 1024]  # INBOUND_EMAIL_MAX_BYTES: larger is quarantined unread
    folder_store.put("fake-bounce", raw)

    poll_once()

    mail = InboundEmail.objects.get()
    assert (mail.status, mail.reason) == (InboundEmail.Status.REJECTED, "bounce")
    assert mail.size == len(raw) and len(bytes(mail.raw)) == 64 * 1024
    assert mail.body_text == ""
    assert [r for r in caplog.records if r.name.startswith("flufl")] == []


@pytest.mark.django_db(transaction=True)
def test_flufl_bounce_logs_nothing_below_warning_for_a_suspected_bounce(folder_store, caplog):
    """Each detector flufl.bounce ran logged an INFO line (17 per mail): a flood of noise
    under anyone's control. Its logger is kept at WARNING."""
    caplog.set_level(logging.DEBUG)
    folder_store.put("suspected", text_bounce())

    poll_once()

    assert InboundEmail.objects.get().reason == "bounce"
    flufl = [r for r in caplog.records if r.name.startswith("flufl")]
    assert [r for r in flufl if r.levelno < logging.WARNING] == []
    assert logging.getLogger("flufl.bounce").getEffectiveLevel() == logging.WARNING
