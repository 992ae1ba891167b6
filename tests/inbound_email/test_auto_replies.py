"""Automatic replies are recognised and never become instructions (issue 21, point 3).

The mails here are shaped like those the named systems send: an Exchange Online out-of-office
carries `X-Auto-Response-Suppress` and `X-MS-Exchange-Generated-Message-Source` but no
`Auto-Submitted`; Request Tracker, OTRS and Zendesk write their loop headers; a localised
vacation notice from a small mail host often has nothing but its subject.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from inbound_email.auto_replies import automatic_reply_detail
from inbound_email.models import InboundEmail, Reply
from inbound_email.parsing import parse_mail
from inbound_email.poller import poll_once
from jobs import run_pending
from jobs.models import Job
from notifications.models import EmailNotification, NotificationPreference
from notifications.services import review_requests_expire
from tests.support.mail import build_mail

Status = InboundEmail.Status
Reason = InboundEmail.Reason

# An out-of-office body that would be relayed as an instruction if it were taken for a reply.
OOF_BODY = (
    "Thank you for your message. I am out of the office until 5 January with limited access "
    "to email. Please contact the grants office for anything urgent."
)

HEADER_CASES = {
    "rfc3834": {"Auto-Submitted": "auto-replied"},
    "rfc3834-generated": {"Auto-Submitted": "auto-generated (vacation)"},
    "x-autoreply": {"X-Autoreply": "yes"},
    "x-autorespond": {"X-Autorespond": "Out of office"},
    "precedence-bulk": {"Precedence": "bulk"},
    "precedence-junk": {"Precedence": "junk"},
    "precedence-list": {"Precedence": "list"},
    "precedence-auto_reply": {"Precedence": "auto_reply"},
    # Exchange Online's OOF: no Auto-Submitted at all.
    "exchange-suppress": {"X-Auto-Response-Suppress": "All", "Thread-Topic": "Your proposal"},
    "exchange-generated": {
        "X-MS-Exchange-Generated-Message-Source": "Mailbox Rules Agent",
        "X-MS-Exchange-Inbox-Rules-Loop": "pi@university.example",
    },
    "request-tracker": {
        "X-RT-Loop-Prevention": "University IT",
        "RT-Ticket": "University IT #48211",
        "X-Managed-BY": "RT 5.0.5 (http://www.bestpractical.com/rt/)",
    },
    "otrs": {"X-OTRS-Loop": "yes", "X-Loop": "helpdesk@university.example"},
    "zendesk": {
        "X-Mailer": "Zendesk Mailer",
        "X-Zendesk-From-Account-Id": "2f9a1e7",
        "X-Zendesk-Email-Id": "01HGW3Z4K2R0",
    },
}

# Out-of-office subjects as the mail systems write them, per language.
SUBJECT_CASES = {
    "en-outlook": "Automatic reply: Re: Your proposal needs a rating",
    "en-plain": "Out of Office: back on Monday",
    "en-tagged": "[EXTERNAL] Automatic reply: Your proposal",
    "de-outlook": "Automatische Antwort: Ihr Antrag",
    "de-notice": "Abwesenheitsnotiz: Re: Your proposal",
    "fr-outlook": "Réponse automatique : Votre proposition",
    "fr-absence": "Absence du bureau jusqu'au 5 janvier",
    "es-outlook": "Respuesta automática: Su propuesta",
    "es-office": "Fuera de la oficina",
    "it-outlook": "Risposta automatica: La sua proposta",
    "it-office": "Fuori ufficio fino al 5 gennaio",
    "pt-outlook": "Resposta automática: A sua proposta",
    "pt-absence": "Ausência temporária",
    "nl-outlook": "Automatisch antwoord: Uw voorstel",
    "nl-absent": "Afwezig tot 5 januari",
    "zh-outlook": "自动答复: 您的提案",
    "zh-reply": "自动回复：Re: Your proposal",
    "zh-tw": "自動回覆: Your proposal",
    "ja-outlook": "自動応答: ご提案について",
    "ja-absent": "不在のお知らせ",
}


@pytest.mark.parametrize("headers", HEADER_CASES.values(), ids=HEADER_CASES.keys())
def test_auto_reply_headers_are_recognised(headers):
    mail = parse_mail(build_mail(token="tok", headers=headers, body=OOF_BODY))
    assert automatic_reply_detail(mail.headers, mail.subject) is not None


@pytest.mark.parametrize("subject", SUBJECT_CASES.values(), ids=SUBJECT_CASES.keys())
def test_out_of_office_subjects_are_recognised_in_nine_languages(subject):
    mail = parse_mail(build_mail(token="tok", subject=subject, body=OOF_BODY))
    detail = automatic_reply_detail(mail.headers, mail.subject)
    assert detail is not None and "subject" in detail


@pytest.mark.parametrize(
    ("headers", "subject"),
    [
        ({}, "Re: Your proposal needs a rating"),
        ({"Auto-Submitted": "no"}, "Re: Your proposal"),
        ({"Precedence": "first-class"}, "AW: Ihr Antrag"),
        ({}, "Re: Out of office budget: please cut travel"),  # a person's answer about it
        ({}, "RE: Automatische Antwort"),  # answering an auto-reply is a person again
        ({"X-Mailer": "Microsoft Outlook 16.0"}, "Re: 您的提案"),
    ],
)
def test_a_persons_reply_is_not_taken_for_an_auto_reply(headers, subject):
    mail = parse_mail(build_mail(token="tok", headers=headers, subject=subject))
    assert automatic_reply_detail(mail.headers, mail.subject) is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("headers", "subject"),
    [
        ({}, "Abwesenheitsnotiz: Re: Your proposal"),
        ({}, "Réponse automatique : Re: Your proposal"),
        ({}, "Respuesta automática: Re: Your proposal"),
        ({"X-Auto-Response-Suppress": "All"}, "Re: Your proposal"),
        ({"X-MS-Exchange-Generated-Message-Source": "Mailbox Rules Agent"}, "Re: Your proposal"),
        ({"X-OTRS-Loop": "yes"}, "[Ticket#2026120410000011] Re: Your proposal"),
    ],
    ids=["de", "fr", "es", "exchange-suppress", "exchange-generated", "otrs"],
)
def test_an_auto_reply_is_recorded_and_has_no_effect(folder_store, notification, headers, subject):
    """From the notified address, with the right token and a body that reads like an
    instruction: still recorded as an auto-reply, never relayed, no notice to anyone, and
    the notification stays unanswered (so the missed-reply ladder counts it as missed)."""
    folder_store.put(
        "oof", build_mail(token=notification.token, headers=headers, subject=subject, body=OOF_BODY)
    )
    poll_once()

    row = InboundEmail.objects.get()
    assert (row.status, row.reason) == (Status.REJECTED, Reason.AUTO_REPLY)
    assert row.rejection_notice is None
    assert not Reply.objects.exists()
    assert not Job.objects.exists()  # no relay
    assert run_pending().claimed == 0
    assert not EmailNotification.objects.filter(kind=EmailNotification.Kind.REPLY_REJECTED).exists()
    notification.refresh_from_db()
    assert notification.status == EmailNotification.Status.SENT
    assert notification.responded_at is None

    # The ladder: when the notification expires, the auto-reply did not answer it.
    expiry = review_requests_expire(
        user_id=notification.user_id,
        notification_ids=[notification.pk],
        now=timezone.now() + timedelta(days=8),
    )
    assert expiry.expired == 1
    assert NotificationPreference.objects.get(user=notification.user).consecutive_missed == 1
