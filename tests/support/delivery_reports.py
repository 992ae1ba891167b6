"""Bounce and complaint reports shaped as the big senders write them (issue 23.2): the DSNs of
Gmail, Outlook (Exchange Online), Postfix and SES, Exim's default text bounce (not RFC 3464)
and an ARF abuse report (RFC 5965). Each embeds or quotes the notification it is about;
`recipient` is the address that bounced or complained.

Shapes copied from real reports of each sender (hosts, ids and dates made up).
"""

# ruff: noqa: E501 - the reports' lines are as long as their senders write them

from __future__ import annotations

ORIGINAL_HEADERS = """\
From: Proposal Assistant <assistant@example.org>
To: {recipient}
Reply-To: replies+{token}@reply.example.org
Subject: New proposal: Soil carbon
Message-ID: <171234.5678.notif@example.org>
Date: Thu, 03 Dec 2026 17:11:58 +0000
List-Unsubscribe: <mailto:replies+{token}@reply.example.org?subject=unsubscribe>
Auto-Submitted: auto-generated
MIME-Version: 1.0
Content-Type: text/plain; charset="utf-8"
"""

ORIGINAL = ORIGINAL_HEADERS + "\nA new proposal is in review: Soil carbon.\n"


def gmail_hard_bounce(recipient: str, token: str = "0" * 32) -> bytes:
    original = ORIGINAL.format(recipient=recipient, token=token)
    return f"""\
Delivered-To: replies@reply.example.org
Return-Path: <>
Received: from mail-sor-f69.google.com (mail-sor-f69.google.com [209.85.220.69])
        by inbound-smtp.us-east-1.amazonaws.com with SMTP id abc123
        for replies@reply.example.org; Thu, 03 Dec 2026 17:12:04 +0000 (UTC)
From: Mail Delivery Subsystem <mailer-daemon@googlemail.com>
To: replies@reply.example.org
Auto-Submitted: auto-replied
Subject: Delivery Status Notification (Failure)
References: <171234.5678.notif@example.org>
In-Reply-To: <171234.5678.notif@example.org>
X-Failed-Recipients: {recipient}
Message-ID: <656d3a24.0c2a0220.b3f1.7c5fSMTPIN_ADDED_MISSING@mx.google.com>
Date: Thu, 03 Dec 2026 09:12:04 -0800 (PST)
MIME-Version: 1.0
Content-Type: multipart/report; boundary="000000000000a1b2c3060b6a7f00"; report-type=delivery-status

--000000000000a1b2c3060b6a7f00
Content-Type: text/plain; charset="UTF-8"


** Address not found **

Your message wasn't delivered to {recipient} because the address couldn't be found, or is unable to receive mail.

Learn more here: https://support.google.com/mail/?p=NoSuchUser

The response was:

The email account that you tried to reach does not exist.

--000000000000a1b2c3060b6a7f00
Content-Type: message/delivery-status

Reporting-MTA: dns; googlemail.com
Received-From-MTA: dns; a8-30.smtp-out.amazonses.com
Arrival-Date: Thu, 03 Dec 2026 09:12:03 -0800 (PST)
X-Original-Message-ID: <171234.5678.notif@example.org>

Final-Recipient: rfc822; {recipient}
Action: failed
Status: 5.1.1
Remote-MTA: dns; gmail-smtp-in.l.google.com. (2607:f8b0:4864:20::1b, the server for the domain gmail.com.)
Diagnostic-Code: smtp; 550-5.1.1 The email account that you tried to reach does not exist. Please try
 550-5.1.1 double-checking the recipient's email address for typos or
 550 5.1.1 unnecessary spaces. https://support.google.com/mail/?p=NoSuchUser d9443c01a7336-1d0b1c2sor1234567plb.83 - gsmtp
Last-Attempt-Date: Thu, 03 Dec 2026 09:12:04 -0800 (PST)

--000000000000a1b2c3060b6a7f00
Content-Type: message/rfc822

{original}
--000000000000a1b2c3060b6a7f00--
""".encode()


def outlook_hard_bounce(recipient: str, token: str = "0" * 32) -> bytes:
    headers = ORIGINAL_HEADERS.format(recipient=recipient, token=token)
    return f"""\
Return-Path: <>
From: postmaster@outlook.com
To: <replies@reply.example.org>
Date: Thu, 3 Dec 2026 17:12:10 +0000
Content-Type: multipart/report; report-type=delivery-status;
	boundary="a7c9e6c4-7d37-4b4c-9a39-6f1d0f6a2b11"
Content-Language: en-US
Message-ID: <5e2a8f0b-8c6e-4c52-a0b8-1f8d5a7e3c21@AM0PR02MB1234.eurprd02.prod.outlook.com>
In-Reply-To: <171234.5678.notif@example.org>
References: <171234.5678.notif@example.org>
Subject: Undeliverable: New proposal: Soil carbon
Auto-Submitted: auto-replied
X-MS-Exchange-Message-Is-Ndr:
MIME-Version: 1.0

--a7c9e6c4-7d37-4b4c-9a39-6f1d0f6a2b11
Content-Type: multipart/alternative; differences=Content-Type;
	boundary="b8f0c1a2-3d4e-4f5a-8b6c-7d8e9f0a1b2c"

--b8f0c1a2-3d4e-4f5a-8b6c-7d8e9f0a1b2c
Content-Type: text/plain; charset="us-ascii"

Your message to {recipient} couldn't be delivered.
{recipient.split("@")[0]} wasn't found at outlook.com.

Remote Server returned '550 5.5.0 Requested action not taken: mailbox unavailable (S2017062302). [AM0PR02MB1234.eurprd02.prod.outlook.com]'

--b8f0c1a2-3d4e-4f5a-8b6c-7d8e9f0a1b2c
Content-Type: text/html; charset="us-ascii"

<html><body><p>Your message to {recipient} couldn't be delivered.</p></body></html>

--b8f0c1a2-3d4e-4f5a-8b6c-7d8e9f0a1b2c--

--a7c9e6c4-7d37-4b4c-9a39-6f1d0f6a2b11
Content-Type: message/delivery-status

Reporting-MTA: dns;AM0PR02MB1234.eurprd02.prod.outlook.com
Received-From-MTA: dns;a8-30.smtp-out.amazonses.com
Arrival-Date: Thu, 3 Dec 2026 17:12:08 +0000

Final-Recipient: rfc822;{recipient}
Action: failed
Status: 5.5.0
Diagnostic-Code: smtp;550 5.5.0 Requested action not taken: mailbox unavailable
 (S2017062302). [AM0PR02MB1234.eurprd02.prod.outlook.com]

--a7c9e6c4-7d37-4b4c-9a39-6f1d0f6a2b11
Content-Type: text/rfc822-headers

{headers}
--a7c9e6c4-7d37-4b4c-9a39-6f1d0f6a2b11--
""".encode()


def exim_hard_bounce(recipient: str, token: str = "0" * 32) -> bytes:
    original = ORIGINAL.format(recipient=recipient, token=token)
    return f"""\
Return-path: <>
Envelope-to: replies@reply.example.org
Received: from mail by mx1.example.net with local (Exim 4.97)
	id 1rAbCd-0001Xy-2Q
	for replies@reply.example.org; Thu, 03 Dec 2026 17:12:09 +0000
X-Failed-Recipients: {recipient}
Auto-Submitted: auto-replied
From: Mail Delivery System <Mailer-Daemon@mx1.example.net>
To: replies@reply.example.org
Content-Type: text/plain; charset=us-ascii
Subject: Mail delivery failed: returning message to sender
Message-Id: <E1rAbCd-0001Xy-2Q@mx1.example.net>
Date: Thu, 03 Dec 2026 17:12:09 +0000

This message was created automatically by mail delivery software.

A message that you sent could not be delivered to one or more of its
recipients. This is a permanent error. The following address(es) failed:

  {recipient}
    SMTP error from remote mail server after RCPT TO:<{recipient}>:
    550 5.1.1 <{recipient}>: Recipient address rejected: User unknown in local recipient table

------ This is a copy of the message, including all the headers. ------

Return-path: <010001900abcdef-0000@amazonses.com>
{original}
""".encode()


def postfix_soft_bounce(recipient: str, token: str = "0" * 32) -> bytes:
    headers = ORIGINAL_HEADERS.format(recipient=recipient, token=token)
    return f"""\
Return-Path: <>
Received: by mx.example.com (Postfix)
	id 4SjK2x1Qz8z9vBk; Thu,  3 Dec 2026 17:12:11 +0000 (UTC)
Date: Thu,  3 Dec 2026 17:12:11 +0000 (UTC)
From: MAILER-DAEMON@mx.example.com (Mail Delivery System)
Subject: Undelivered Mail Returned to Sender
To: replies@reply.example.org
Auto-Submitted: auto-replied
MIME-Version: 1.0
Content-Type: multipart/report; report-type=delivery-status;
	boundary="4SjK2x1Qz8z9vBk.1701623531/mx.example.com"
Content-Transfer-Encoding: 8bit
Message-Id: <20261203171211.4SjK2x1Qz8z9vBk@mx.example.com>

This is a MIME-encapsulated message.

--4SjK2x1Qz8z9vBk.1701623531/mx.example.com
Content-Description: Notification
Content-Type: text/plain; charset=utf-8
Content-Transfer-Encoding: 8bit

This is the mail system at host mx.example.com.

I'm sorry to have to inform you that your message could not
be delivered to one or more recipients. It's attached below.

                   The mail system

<{recipient}>: host mailstore.example.com[192.0.2.25] said: 452 4.2.2
    Mailbox full (in reply to RCPT TO command)

--4SjK2x1Qz8z9vBk.1701623531/mx.example.com
Content-Description: Delivery report
Content-Type: message/delivery-status

Reporting-MTA: dns; mx.example.com
X-Postfix-Queue-ID: 4SjK2x1Qz8z9vBk
X-Postfix-Sender: rfc822; 010001900abcdef-0000@amazonses.com
Arrival-Date: Sat, 28 Nov 2026 17:11:59 +0000 (UTC)

Final-Recipient: rfc822; {recipient}
Original-Recipient: rfc822;{recipient}
Action: failed
Status: 4.2.2
Remote-MTA: dns; mailstore.example.com
Diagnostic-Code: smtp; 452 4.2.2 Mailbox full

--4SjK2x1Qz8z9vBk.1701623531/mx.example.com
Content-Description: Undelivered Message Headers
Content-Type: text/rfc822-headers
Content-Transfer-Encoding: 8bit

{headers}
--4SjK2x1Qz8z9vBk.1701623531/mx.example.com--
""".encode()


def ses_hard_bounce(recipient: str, token: str = "0" * 32) -> bytes:
    original = ORIGINAL.format(recipient=recipient, token=token)
    return f"""\
Return-Path: <>
Received: from a27-30.smtp-out.us-west-2.amazonses.com (a27-30.smtp-out.us-west-2.amazonses.com [54.240.27.30])
 by inbound-smtp.us-east-1.amazonaws.com with SMTP id 6b2ffs0lkp3c7kd6
 for replies@reply.example.org; Thu, 03 Dec 2026 17:12:02 +0000 (UTC)
From: MAILER-DAEMON@amazonses.com
To: replies@reply.example.org
Subject: Delivery Status Notification (Failure)
Message-ID: <0101018c2e1f5a7b-1d2c3b4a-0f9e-4d8c-b7a6-5e4d3c2b1a09-000000@us-west-2.amazonses.com>
Date: Thu, 3 Dec 2026 17:12:02 +0000
MIME-Version: 1.0
Content-Type: multipart/report;
 boundary="----=_Part_1234567_890123456.1701623522000"; report-type=delivery-status
X-SES-Outgoing: 2026.12.03-54.240.27.30

------=_Part_1234567_890123456.1701623522000
Content-Type: text/plain; charset=UTF-8
Content-Transfer-Encoding: 7bit

An error occurred while trying to deliver the mail to the following recipients:
{recipient}
------=_Part_1234567_890123456.1701623522000
Content-Type: message/delivery-status
Content-Transfer-Encoding: 7bit

Reporting-MTA: dns; a27-30.smtp-out.us-west-2.amazonses.com

Final-Recipient: rfc822; {recipient}
Action: failed
Status: 5.1.1
Remote-MTA: dns; mx.example.net. 192.0.2.40
Diagnostic-Code: smtp; 550 5.1.1 user unknown


------=_Part_1234567_890123456.1701623522000
Content-Type: message/rfc822
Content-Transfer-Encoding: 7bit

{original}
------=_Part_1234567_890123456.1701623522000--
""".encode()


def arf_complaint(recipient: str, token: str = "0" * 32, *, redacted: bool = False) -> bytes:
    """An abuse report as a mailbox provider's feedback loop sends it (RFC 5965). Redacted:
    no Original-Rcpt-To (many providers leave the recipient out); the returned message's To
    names it."""
    original = ORIGINAL.format(recipient=recipient, token=token)
    rcpt = "" if redacted else f"Original-Rcpt-To: <{recipient}>\n"
    return f"""\
Return-Path: <fbl-bounces@feedback.example.net>
From: Feedback Loop <fbl@feedback.example.net>
To: replies@reply.example.org
Subject: Abuse report: New proposal: Soil carbon
Date: Thu, 03 Dec 2026 18:02:11 +0000
Message-ID: <fbl.20261203180211.77123@feedback.example.net>
MIME-Version: 1.0
Content-Type: multipart/report; report-type=feedback-report;
	boundary="part1_13d.2e68ed54_boundary"

--part1_13d.2e68ed54_boundary
Content-Type: text/plain; charset="US-ASCII"
Content-Transfer-Encoding: 7bit

This is an email abuse report for an email message received from IP
54.240.27.30 on Thu, 03 Dec 2026 17:12:02 +0000.
For more information about this format please see
http://tools.ietf.org/html/rfc5965

--part1_13d.2e68ed54_boundary
Content-Type: message/feedback-report

Feedback-Type: abuse
User-Agent: ExampleFBL/2.1
Version: 1
Original-Mail-From: <010001900abcdef-0000@amazonses.com>
{rcpt}Arrival-Date: Thu, 03 Dec 2026 17:12:02 +0000
Reported-Domain: example.org
Source-IP: 54.240.27.30

--part1_13d.2e68ed54_boundary
Content-Type: message/rfc822
Content-Disposition: inline

{original}
--part1_13d.2e68ed54_boundary--
""".encode()


def addressed_to(report: bytes, address: str) -> bytes:
    """The report delivered to `address` instead of the inbound base address: its own header
    block's To, Delivered-To, Envelope-to and Received lines (the returned message inside is
    left as it is). A genuine report goes to the notification's envelope sender."""
    head, sep, body = report.partition(b"\n\n")
    return head.replace(b"replies@reply.example.org", address.encode()) + sep + body
