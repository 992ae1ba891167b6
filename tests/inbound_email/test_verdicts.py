"""SES verdicts (issue 10 point 2): a reply whose sender SES could not authenticate is rejected,
a mail SES found a virus in is quarantined, and a verdict an attacker wrote into the mail is
never the one that counts.

SES prepends its headers to the mail it stores, so its verdicts are the topmost fields; the
mails here are built the same way: the PI's (or the attacker's) mail, with the fields SES
would write put in front of it.
"""

from __future__ import annotations

from email import message_from_bytes, policy
from email.message import EmailMessage

import pytest

from inbound_email.models import InboundEmail, Reply
from inbound_email.poller import poll_once
from inbound_email.services.acceptance import Quarantine, Reject, screen_ses_verdicts
from inbound_email.verdicts import (
    SesVerdicts,
    read_authentication_results_dmarc,
    read_ses_verdicts,
)
from jobs import run_pending
from notifications.models import EmailNotification
from tests.support.mail import build_mail
from tests.support.stores import intake_keys, key

Status = InboundEmail.Status
Reason = InboundEmail.Reason

ALL_PASS = {
    "X-SES-Spam-Verdict": "PASS",
    "X-SES-Virus-Verdict": "PASS",
    "X-SES-SPF-Verdict": "PASS",
    "X-SES-DKIM-Verdict": "PASS",
    "X-SES-DMARC-Verdict": "PASS",
}


def ses_prepended(mail: bytes, fields: dict[str, str] | list[tuple[str, str]]) -> bytes:
    """The mail as SES stores it: its own fields in front of the mail it received."""
    items = fields.items() if isinstance(fields, dict) else fields
    head = "".join(f"{name}: {value}\r\n" for name, value in items).encode()
    return head + mail


def verdicts_of(fields: dict[str, str]) -> dict[str, str]:
    return {**ALL_PASS, **fields}


# --- reading the verdicts (pure) -------------------------------------------------------------


def test_the_five_verdicts_are_read_from_the_headers():
    headers = [
        ("Return-Path", "<pi@university.example>"),
        ("X-SES-Spam-Verdict", "PASS"),
        ("X-SES-Virus-Verdict", "FAIL"),
        ("X-SES-SPF-Verdict", "GRAY"),
        ("X-SES-DKIM-Verdict", "PROCESSING_FAILED"),
        ("X-SES-DMARC-Verdict", "PASS"),
    ]
    assert read_ses_verdicts(headers) == SesVerdicts(
        spam="PASS", virus="FAIL", spf="GRAY", dkim="PROCESSING_FAILED", dmarc="PASS"
    )


def test_an_absent_verdict_reads_as_empty_and_garbage_as_unknown():
    verdicts = read_ses_verdicts([("X-SES-DMARC-Verdict", "maybe?"), ("X-SES-SPF-Verdict", "")])
    assert (verdicts.dmarc, verdicts.spf, verdicts.dkim, verdicts.virus) == (
        "UNKNOWN",
        "UNKNOWN",
        "",
        "",
    )
    assert verdicts.any_present()  # present, if unreadable


def test_no_verdict_header_at_all_is_reported_as_none_present():
    assert not read_ses_verdicts([("From", "pi@university.example")]).any_present()


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("x-ses-dmarc-verdict", "FAIL", "FAIL"),  # header names are case-insensitive
        ("X-Ses-Dmarc-Verdict", "fail", "FAIL"),  # so are the values
        ("X-SES-DMARC-VERDICT", "  Fail \t", "FAIL"),  # surrounding whitespace
        ("X-SES-DMARC-Verdict", "FAIL (policy=reject)", "FAIL"),  # a trailing comment
        ("X-SES-DMARC-Verdict", "FAIL\x00PASS", "UNKNOWN"),  # no smuggled second word
        ("X-SES-DMARC-Verdict", "PASSED", "UNKNOWN"),  # only SES's exact words count
    ],
)
def test_odd_case_and_whitespace_read_as_the_same_verdict(name, value, expected):
    assert read_ses_verdicts([(name, value)]).dmarc == expected


def test_the_topmost_copy_of_a_verdict_counts_and_a_later_one_is_ignored():
    """SES prepends: the first copy is SES's; an attacker's own copy sits below it."""
    headers = [
        ("X-SES-DMARC-Verdict", "FAIL"),  # SES
        ("From", "pi@university.example"),
        ("X-SES-DMARC-Verdict", "PASS"),  # the attacker's
        ("x-ses-dmarc-verdict", "PASS"),
    ]
    assert read_ses_verdicts(headers).dmarc == "FAIL"


# --- the policy (pure) ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spf", "dkim", "dmarc", "rejected"),
    [
        ("PASS", "PASS", "PASS", False),
        ("FAIL", "FAIL", "PASS", False),  # DMARC passed: it decides (aligned DKIM or SPF)
        ("PASS", "PASS", "FAIL", True),  # DMARC failed: rejected whatever SPF and DKIM say
        ("FAIL", "FAIL", "FAIL", True),
        ("FAIL", "FAIL", "", True),  # no DMARC verdict: SPF and DKIM both failed
        ("FAIL", "FAIL", "GRAY", True),  # GRAY: the domain has no DMARC policy
        ("FAIL", "FAIL", "PROCESSING_FAILED", True),
        ("FAIL", "FAIL", "UNKNOWN", True),
        ("FAIL", "PASS", "", False),  # one of them passed
        ("PASS", "FAIL", "", False),
        ("FAIL", "GRAY", "", False),  # unsigned mail is not a DKIM failure
        ("GRAY", "GRAY", "GRAY", False),
        ("", "", "", False),  # no verdicts: the From check still applies
    ],
)
def test_dmarc_decides_and_without_it_spf_and_dkim_must_both_fail(spf, dkim, dmarc, rejected):
    outcome = screen_ses_verdicts(SesVerdicts(spf=spf, dkim=dkim, dmarc=dmarc))
    if rejected:
        assert isinstance(outcome, Reject)
        assert outcome.reason == Reason.UNAUTHENTICATED_SENDER
    else:
        assert outcome is None


@pytest.mark.parametrize("dmarc", ["PASS", "FAIL", ""])
def test_a_virus_is_quarantined_before_anything_else(dmarc):
    outcome = screen_ses_verdicts(SesVerdicts(virus="FAIL", dmarc=dmarc))
    assert isinstance(outcome, Quarantine)
    assert outcome.reason == Reason.VIRUS


@pytest.mark.parametrize("virus", ["PASS", "GRAY", "PROCESSING_FAILED", "", "UNKNOWN"])
def test_only_a_virus_fail_quarantines(virus):
    assert screen_ses_verdicts(SesVerdicts(virus=virus)) is None


def test_a_spam_verdict_fail_rejects_with_its_own_reason():
    """Issue 21: what SES scores as spam is not acted on, even from an authenticated sender."""
    decision = screen_ses_verdicts(SesVerdicts(spam="FAIL", dmarc="PASS"))
    assert isinstance(decision, Reject)
    assert decision.reason == Reason.SPAM
    assert "X-SES-Spam-Verdict: FAIL" in decision.detail


@pytest.mark.parametrize("spam", ["PASS", "GRAY", "PROCESSING_FAILED", "", "UNKNOWN"])
def test_only_a_spam_fail_rejects(spam):
    assert screen_ses_verdicts(SesVerdicts(spam=spam, dmarc="PASS")) is None


# --- Authentication-Results (pure) ------------------------------------------------------------

# The field SES writes on every mail it receives (the comment is SES's; the envelope sender and
# HELO name in it are whatever the sending host said).
SES_AR = (
    "amazonses.com;\r\n spf=pass (spf: domain of university.example designates 192.0.2.7 as"
    " permitted sender) client-ip=192.0.2.7; envelope-from=pi@university.example;"
    " helo=mail.university.example;\r\n dkim=pass header.i=@university.example;\r\n"
    " dmarc={dmarc} header.from=university.example;"
)


def ar(dmarc: str) -> str:
    return SES_AR.format(dmarc=dmarc)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([("Authentication-Results", ar("fail"))], "fail"),
        ([("Authentication-Results", ar("pass"))], "pass"),
        ([("authentication-results", ar("FAIL (p=REJECT sp=REJECT dis=REJECT)"))], "fail"),
        ([("Authentication-Results", "AmazonSES.com 1; dmarc=fail header.from=x.example")], "fail"),
        ([("Authentication-Results", "amazonses.com; dmarc/1=fail header.from=x.example")], "fail"),
        ([("Authentication-Results", "amazonses.com; spf=pass smtp.mailfrom=x.example")], ""),
        ([("Authentication-Results", "amazonses.com; none")], ""),
        ([("From", "pi@university.example")], ""),
    ],
    ids=[
        "ses-fail",
        "ses-pass",
        "comment-and-case",
        "version",
        "method-version",
        "none",
        "none2",
        "absent",
    ],
)
def test_the_dmarc_result_of_the_receiving_hosts_field_is_read(headers, expected):
    assert read_authentication_results_dmarc(headers, authserv_id="amazonses.com") == expected


def test_only_the_topmost_field_counts_and_only_from_the_receiving_host():
    forged_fail_below = [
        ("Authentication-Results", ar("pass")),
        ("Authentication-Results", "amazonses.com; dmarc=fail header.from=university.example"),
    ]
    assert read_authentication_results_dmarc(forged_fail_below, authserv_id="amazonses.com") == (
        "pass"
    )
    # A field naming another host is not the receiver's, whatever it says, top or not.
    other_host_on_top = [
        ("Authentication-Results", "mx.evil.example; dmarc=fail header.from=university.example"),
        ("Authentication-Results", ar("pass")),
    ]
    assert read_authentication_results_dmarc(other_host_on_top, authserv_id="amazonses.com") == ""
    assert (
        read_authentication_results_dmarc([("Authentication-Results", ar("fail"))], authserv_id="")
        == ""
    )


def test_sender_chosen_text_in_a_comment_is_never_read_as_a_result():
    """The envelope sender and HELO name are the sender's words; SES echoes them in comments."""
    value = (
        "amazonses.com; spf=pass (spf: domain of x; dmarc=fail (nested) designates 192.0.2.7)"
        " smtp.mailfrom=pi@university.example; dmarc=pass header.from=university.example"
    )
    headers = [("Authentication-Results", value)]
    assert read_authentication_results_dmarc(headers, authserv_id="amazonses.com") == "pass"
    quoted = [("Authentication-Results", 'amazonses.com; spf=pass smtp.mailfrom="a;dmarc=fail"')]
    assert read_authentication_results_dmarc(quoted, authserv_id="amazonses.com") == ""


def test_dmarc_fail_in_authentication_results_rejects_even_without_a_ses_dmarc_verdict():
    decision = screen_ses_verdicts(SesVerdicts(spf="PASS", dkim="PASS"), auth_results_dmarc="fail")
    assert isinstance(decision, Reject)
    assert decision.reason == Reason.UNAUTHENTICATED_SENDER
    assert "Authentication-Results" in decision.detail


# --- through the poller -----------------------------------------------------------------------


@pytest.fixture
def check_on(settings):
    settings.INBOUND_EMAIL_CHECK_SES_VERDICTS = True


def poll_one(store, raw: bytes, name: str = "m1") -> InboundEmail:
    store.put(key(store, name), raw)
    poll_once(store=store)
    return InboundEmail.objects.get(store_key=key(store, name))


@pytest.mark.django_db
@pytest.mark.usefixtures("check_on")
@pytest.mark.parametrize(
    "fields",
    [
        {"X-SES-DMARC-Verdict": "FAIL"},
        {"X-SES-DMARC-Verdict": "GRAY", "X-SES-SPF-Verdict": "FAIL", "X-SES-DKIM-Verdict": "FAIL"},
    ],
    ids=["dmarc-fail", "no-dmarc-spf-and-dkim-fail"],
)
def test_a_spoofed_reply_from_the_notified_address_is_rejected(folder_store, notification, fields):
    """The From is the notified address and the token is right: only SES knows it is forged."""
    raw = ses_prepended(build_mail(token=notification.token), verdicts_of(fields))
    row = poll_one(folder_store, raw)

    assert (row.status, row.reason) == (Status.REJECTED, Reason.UNAUTHENTICATED_SENDER)
    assert "FAIL" in row.detail
    assert not Reply.objects.exists()
    notification.refresh_from_db()
    assert notification.status == EmailNotification.Status.SENT  # not answered by a forgery
    assert row.raw is not None  # kept for an operator


@pytest.mark.django_db
@pytest.mark.usefixtures("check_on")
def test_an_authenticated_reply_is_accepted(folder_store, notification):
    raw = ses_prepended(build_mail(token=notification.token, body="4"), ALL_PASS)
    row = poll_one(folder_store, raw)
    assert row.status == Status.PROCESSED
    assert Reply.objects.get().rating == 4


@pytest.mark.django_db
@pytest.mark.usefixtures("check_on")
def test_a_mail_with_a_virus_is_quarantined_with_its_own_reason(store, notification):
    raw = ses_prepended(
        build_mail(token=notification.token), verdicts_of({"X-SES-Virus-Verdict": "FAIL"})
    )
    row = poll_one(store, raw)

    assert (row.status, row.reason) == (Status.QUARANTINED, Reason.VIRUS)
    assert row.quarantine_key  # moved out of the intake, kept for an operator
    assert intake_keys(store) == []
    assert not Reply.objects.exists()


@pytest.mark.django_db
@pytest.mark.usefixtures("check_on")
def test_an_attackers_pass_below_ses_fail_does_not_count(folder_store, notification):
    """The attacker writes X-SES-DMARC-Verdict: PASS into the forged mail; SES puts its own
    FAIL on top. The topmost copy is SES's and decides."""
    forged = build_mail(
        token=notification.token,
        headers={"X-SES-DMARC-Verdict": "PASS", "X-SES-Virus-Verdict": "PASS"},
    )
    raw = ses_prepended(forged, verdicts_of({"X-SES-DMARC-Verdict": "FAIL"}))
    row = poll_one(folder_store, raw)
    assert (row.status, row.reason) == (Status.REJECTED, Reason.UNAUTHENTICATED_SENDER)


@pytest.mark.django_db
@pytest.mark.usefixtures("check_on")
def test_an_attackers_fail_below_ses_pass_does_not_reject_a_genuine_reply(
    folder_store, notification
):
    """The reverse: a quoted or forwarded verdict further down cannot get a genuine reply
    rejected or quarantined either."""
    genuine = build_mail(
        token=notification.token,
        body="5",
        headers={"x-ses-dmarc-verdict": "FAIL", "X-SES-VIRUS-VERDICT": "FAIL"},
    )
    row = poll_one(folder_store, ses_prepended(genuine, ALL_PASS))
    assert row.status == Status.PROCESSED


@pytest.mark.django_db
@pytest.mark.usefixtures("check_on")
def test_odd_case_and_whitespace_from_ses_still_reject(folder_store, notification):
    raw = ses_prepended(
        build_mail(token=notification.token),
        [("x-ses-dmarc-verdict", "  fail  "), ("X-SES-Virus-Verdict", "pass")],
    )
    row = poll_one(folder_store, raw)
    assert (row.status, row.reason) == (Status.REJECTED, Reason.UNAUTHENTICATED_SENDER)


@pytest.mark.django_db
@pytest.mark.usefixtures("check_on")
def test_a_verdict_inside_an_attached_message_is_not_read(folder_store, notification):
    """Only the top-level header block is SES's; a message/rfc822 part is the sender's."""
    reply = message_from_bytes(
        build_mail(token=notification.token, body="4"), policy=policy.default
    )
    forwarded = EmailMessage()
    forwarded["X-SES-DMARC-Verdict"] = "FAIL"
    forwarded["X-SES-Virus-Verdict"] = "FAIL"
    forwarded["From"] = "someone@elsewhere.example"
    forwarded.set_content("forwarded")
    reply.add_attachment(forwarded)
    row = poll_one(folder_store, ses_prepended(reply.as_bytes(), ALL_PASS))
    # Accepted; the attached mail is relayed with the rating (issue 21.1), then processed.
    assert (row.status, row.reason) == (Status.AWAITING_RELAY, "")
    run_pending()
    row.refresh_from_db()
    assert row.status == Status.PROCESSED


@pytest.mark.django_db
@pytest.mark.usefixtures("check_on")
def test_a_rejected_verdict_never_parses_the_body(folder_store, notification, settings):
    """Checked on the header block only: the body of a forged mail (here past the text limit,
    which would quarantine it if it were parsed) is never looked at."""
    settings.INBOUND_EMAIL_MAX_TEXT_BYTES = 1024
    raw = ses_prepended(
        build_mail(token=notification.token, body="4\n" + "x" * 5000),
        verdicts_of({"X-SES-DMARC-Verdict": "FAIL"}),
    )
    row = poll_one(folder_store, raw)
    assert (row.status, row.reason) == (Status.REJECTED, Reason.UNAUTHENTICATED_SENDER)
    assert row.body_text == ""  # the body was not parsed


@pytest.mark.django_db
def test_the_check_is_off_for_the_folder_store_by_default(folder_store, notification, settings):
    """A folder store is fed by hand or by a test, not by SES: no verdicts to trust."""
    assert getattr(settings, "INBOUND_EMAIL_CHECK_SES_VERDICTS", None) is None
    raw = ses_prepended(
        build_mail(token=notification.token, body="4"),
        verdicts_of({"X-SES-DMARC-Verdict": "FAIL"}),
    )
    row = poll_one(folder_store, raw)
    assert row.status == Status.PROCESSED


@pytest.mark.django_db
def test_the_check_is_on_for_the_s3_store_by_default(s3_store, notification, settings):
    assert getattr(settings, "INBOUND_EMAIL_CHECK_SES_VERDICTS", None) is None
    raw = ses_prepended(
        build_mail(token=notification.token), verdicts_of({"X-SES-DMARC-Verdict": "FAIL"})
    )
    row = poll_one(s3_store, raw)
    assert (row.status, row.reason) == (Status.REJECTED, Reason.UNAUTHENTICATED_SENDER)


@pytest.mark.django_db
def test_the_check_can_be_turned_off_for_s3(s3_store, notification, settings):
    settings.INBOUND_EMAIL_CHECK_SES_VERDICTS = False
    raw = ses_prepended(
        build_mail(token=notification.token, body="4"),
        verdicts_of({"X-SES-DMARC-Verdict": "FAIL"}),
    )
    assert poll_one(s3_store, raw).status == Status.PROCESSED


@pytest.mark.django_db
@pytest.mark.usefixtures("check_on")
def test_a_spoofed_reply_failing_dmarc_in_authentication_results_is_rejected_without_notice(
    folder_store, notification
):
    """SES's verdict fields say nothing about DMARC here; its Authentication-Results does."""
    fields = [
        ("Authentication-Results", ar("fail")),
        *[(k, v) for k, v in ALL_PASS.items() if k != "X-SES-DMARC-Verdict"],
    ]
    raw = ses_prepended(build_mail(token=notification.token, body="Cancel the proposal."), fields)
    row = poll_one(folder_store, raw)

    assert (row.status, row.reason) == (Status.REJECTED, Reason.UNAUTHENTICATED_SENDER)
    assert "Authentication-Results" in row.detail
    assert row.rejection_notice is None
    assert not EmailNotification.objects.filter(
        kind=EmailNotification.Kind.REPLY_REJECTED
    ).exists()  # nothing sent to the address the forger wrote
    assert not Reply.objects.exists()
    notification.refresh_from_db()
    assert notification.status == EmailNotification.Status.SENT


@pytest.mark.django_db
@pytest.mark.usefixtures("check_on")
def test_an_authentication_results_field_the_sender_wrote_below_ses_does_not_reject(
    folder_store, notification
):
    raw = ses_prepended(
        build_mail(token=notification.token, body="4"),
        [("Authentication-Results", ar("pass")), *ALL_PASS.items()],
    )
    raw = raw.replace(
        b"Subject:", b"Authentication-Results: amazonses.com; dmarc=fail\r\nSubject:", 1
    )
    row = poll_one(folder_store, raw)
    assert row.status == Status.PROCESSED


@pytest.mark.django_db
@pytest.mark.usefixtures("check_on")
def test_a_mail_ses_scored_as_spam_is_rejected_without_notice(folder_store, notification):
    raw = ses_prepended(
        build_mail(token=notification.token, body="Buy now: cheap grants!"),
        verdicts_of({"X-SES-Spam-Verdict": "FAIL"}),
    )
    row = poll_one(folder_store, raw)

    assert (row.status, row.reason) == (Status.REJECTED, Reason.SPAM)
    assert row.rejection_notice is None
    assert not EmailNotification.objects.filter(kind=EmailNotification.Kind.REPLY_REJECTED).exists()
    assert not Reply.objects.exists()
