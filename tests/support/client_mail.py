"""Replies shaped as Gmail, Outlook (on the web, and the Windows desktop client) and Apple Mail
send them: multipart/alternative with a plain-text twin and the HTML each client writes,
quoted history included, with the header fields each client sets.

The markup follows what those clients produce (class and id names, the Word-generated
desktop Outlook HTML, Apple's `blockquote type=cite`); the addresses, dates and text are
ours. `new_html` / `new_plain` are the PI's new text as that client would write it.
"""

from __future__ import annotations

from email.message import EmailMessage
from email.utils import make_msgid

from notifications.reply_address import reply_address_for
from tests.support.mail import PI_ADDRESS

ASSISTANT = "Proposal Assistant <assistant@grants.example>"
SUBJECT = 'Your proposal "Quantum sensing of soil moisture" needs a rating'
# Our notification as the clients quote it; its preheader is hidden, as in most HTML mail.
NOTIFICATION_HTML = (
    '<div style="display:none;max-height:0;overflow:hidden">Rate it from 1 to 5 by replying'
    "</div><p>Please rate this proposal from 1 to 5.</p>"
    "<p>Reply with instructions for the agent.</p>"
)
NOTIFICATION_PLAIN = (
    "Please rate this proposal from 1 to 5.\nReply with instructions for the agent."
)


def _mail(
    *,
    token: str,
    plain: str,
    html: str,
    headers: dict[str, str],
    subject_prefix: str = "Re: ",
    html_charset: str = "utf-8",
) -> bytes:
    msg = EmailMessage()
    msg["From"] = f"Ada Lovelace <{PI_ADDRESS}>"
    msg["To"] = f"Proposal Assistant <{reply_address_for(token)}>"
    msg["Subject"] = subject_prefix + SUBJECT
    msg["Date"] = "Thu, 4 Dec 2026 10:12:33 +0100"
    msg["Message-ID"] = make_msgid(domain=headers.pop("_msgid_domain", "university.example"))
    msg["In-Reply-To"] = "<0100018f-ses-notification@email.amazonses.com>"
    msg["References"] = "<0100018f-ses-notification@email.amazonses.com>"
    for name, value in headers.items():
        msg[name] = value
    msg.set_content(plain)
    msg.add_alternative(html, subtype="html", charset=html_charset)
    return msg.as_bytes()


def gmail_reply(*, token: str, new_html: str, new_plain: str) -> bytes:
    """Gmail (web): `div.gmail_quote` holding `div.gmail_attr` and `blockquote.gmail_quote`."""
    html = (
        f'<div dir="ltr">{new_html}</div><br>'
        '<div class="gmail_quote gmail_quote_container">'
        '<div dir="ltr" class="gmail_attr">On Mon, Dec 1, 2026 at 9:00\u202fAM Proposal '
        'Assistant &lt;<a href="mailto:assistant@grants.example">assistant@grants.example</a>'
        "&gt; wrote:<br></div>"
        '<blockquote class="gmail_quote" style="margin:0px 0px 0px 0.8ex;border-left:1px solid '
        f'rgb(204,204,204);padding-left:1ex"><div>{NOTIFICATION_HTML}</div></blockquote></div>'
    )
    quoted = "\n".join(f"> {line}" for line in NOTIFICATION_PLAIN.splitlines())
    plain = f"{new_plain}\n\nOn Mon, Dec 1, 2026 at 9:00\u202fAM {ASSISTANT} wrote:\n\n{quoted}\n"
    return _mail(
        token=token,
        plain=plain,
        html=html,
        headers={"_msgid_domain": "mail.gmail.com"},
    )


def outlook_web_reply(*, token: str, new_html: str, new_plain: str) -> bytes:
    """Outlook on the web / new Outlook: `div#appendonsend`, an `hr`, `div#divRplyFwdMsg`
    (From / Sent / To / Subject), then the original after it, not inside it."""
    style = (
        "font-family: Aptos, Aptos_EmbeddedFont, Aptos_MSFontService, Calibri, Helvetica, "
        "sans-serif; font-size: 12pt; color: rgb(0, 0, 0);"
    )
    html = (
        '<html><head><meta http-equiv="Content-Type" content="text/html; charset=utf-8">'
        '<style type="text/css" style="display:none;"> P {margin-top:0;margin-bottom:0;} '
        '</style></head><body dir="ltr">'
        f'<div class="elementToProof" style="{style}">{new_html}</div>'
        '<div id="appendonsend"></div>'
        '<hr style="display:inline-block;width:98%" tabindex="-1">'
        '<div id="divRplyFwdMsg" dir="ltr"><font face="Calibri, sans-serif" '
        'style="font-size:11pt" color="#000000"><b>From:</b> Proposal Assistant '
        "&lt;assistant@grants.example&gt;<br><b>Sent:</b> Monday, December 1, 2026 09:00<br>"
        "<b>To:</b> Ada Lovelace &lt;pi@university.example&gt;<br>"
        f"<b>Subject:</b> {SUBJECT}</font><div>&nbsp;</div></div>"
        f"<div>{NOTIFICATION_HTML}</div></body></html>"
    )
    plain = (
        f"{new_plain}\n\n________________________________\nFrom: {ASSISTANT}\n"
        f"Sent: Monday, December 1, 2026 09:00\nTo: Ada Lovelace <{PI_ADDRESS}>\n"
        f"Subject: {SUBJECT}\n\n{NOTIFICATION_PLAIN}\n"
    )
    return _mail(
        token=token,
        plain=plain,
        html=html,
        subject_prefix="RE: ",
        headers={
            "Thread-Topic": SUBJECT,
            "Thread-Index": "AQHbZ3p1c2x0aW5nLXJlcGx5LXRocmVhZA==",
            "Accept-Language": "en-GB, en-US",
            "Content-Language": "en-GB",
            "X-MS-Has-Attach": "",
            "X-MS-TNEF-Correlator": "",
            "X-MS-Exchange-Organization-SCL": "-1",
            "msip_labels": "",
            "_msgid_domain": "AM0PR07MB1234.eurprd07.prod.outlook.com",
        },
    )


def outlook_desktop_reply(*, token: str, new_html: str, new_plain: str) -> bytes:
    """Outlook for Windows (Word-generated HTML): the reply header is a `div` with a top
    border ("From: … Sent: …"), and the original follows it in the same `WordSection1`."""
    html = (
        '<html xmlns:v="urn:schemas-microsoft-com:vml" xmlns:o="urn:schemas-microsoft-com:'
        'office:office" xmlns:w="urn:schemas-microsoft-com:office:word" '
        'xmlns:m="http://schemas.microsoft.com/office/2004/12/omml" '
        'xmlns="http://www.w3.org/TR/REC-html40"><head>'
        '<meta http-equiv="Content-Type" content="text/html; charset=utf-8">'
        '<meta name="Generator" content="Microsoft Word 15 (filtered medium)">'
        "<style><!--\n/* Style Definitions */\np.MsoNormal, li.MsoNormal, div.MsoNormal\n"
        '\t{margin:0cm;\n\tfont-size:11.0pt;\n\tfont-family:"Calibri",sans-serif;}\n'
        "span.EmailStyle19\n\t{mso-style-type:personal-reply;}\n--></style>"
        '<!--[if gte mso 9]><xml>\n<o:shapedefaults v:ext="edit" spidmax="1026" />\n'
        "</xml><![endif]--></head>"
        '<body lang="EN-US" link="#0563C1" vlink="#954F72" style="word-wrap:break-word">'
        f'<div class="WordSection1">{new_html}'
        '<p class="MsoNormal"><o:p>&nbsp;</o:p></p>'
        '<div><div style="border:none;border-top:solid #E1E1E1 1.0pt;padding:3.0pt 0cm 0cm 0cm">'
        '<p class="MsoNormal"><b><span lang="DE">From:</span></b><span lang="DE"> Proposal '
        "Assistant &lt;assistant@grants.example&gt; <br><b>Sent:</b> Monday, 1 December 2026 "
        "09:00<br><b>To:</b> Ada Lovelace &lt;pi@university.example&gt;<br>"
        f"<b>Subject:</b> {SUBJECT}<o:p></o:p></span></p></div></div>"
        '<p class="MsoNormal"><o:p>&nbsp;</o:p></p>'
        '<p class="MsoNormal">Please rate this proposal from 1 to 5.<o:p></o:p></p>'
        '<p class="MsoNormal">Reply with instructions for the agent.<o:p></o:p></p>'
        "</div></body></html>"
    )
    plain = (
        f"{new_plain}\n\nFrom: {ASSISTANT}\nSent: Monday, 1 December 2026 09:00\n"
        f"To: Ada Lovelace <{PI_ADDRESS}>\nSubject: {SUBJECT}\n\n{NOTIFICATION_PLAIN}\n"
    )
    return _mail(
        token=token,
        plain=plain,
        html=html,
        subject_prefix="RE: ",
        headers={
            "Thread-Topic": SUBJECT,
            "Thread-Index": "AQHbZ3p1c2x0aW5nLXJlcGx5LXRocmVhZA==",
            "X-Mailer": "Microsoft Outlook 16.0",
            "Content-Language": "en-gb",
            "X-MS-Exchange-Organization-AuthAs": "Internal",
        },
    )


def apple_mail_reply(*, token: str, new_html: str, new_plain: str) -> bytes:
    """Apple Mail (macOS / iOS): the new text straight in `body`, the quote in
    `blockquote type=cite` with the attribution inside it."""
    html = (
        '<html aria-label="message body"><head><meta http-equiv="content-type" '
        'content="text/html; charset=utf-8"></head><body style="overflow-wrap: break-word; '
        '-webkit-nbsp-mode: space; line-break: after-white-space;">'
        f"{new_html}"
        '<div><br><blockquote type="cite"><div>On 1 Dec 2026, at 09:00, Proposal Assistant '
        '&lt;assistant@grants.example&gt; wrote:</div><br class="Apple-interchange-newline">'
        f"<div><div>{NOTIFICATION_HTML}</div></div></blockquote></div><br></body></html>"
    )
    quoted = "\n".join(f"> {line}" for line in NOTIFICATION_PLAIN.splitlines())
    plain = f"{new_plain}\n\n> On 1 Dec 2026, at 09:00, {ASSISTANT} wrote:\n> \n{quoted}\n"
    return _mail(
        token=token,
        plain=plain,
        html=html,
        headers={
            "X-Mailer": "Apple Mail (2.3826.200.121)",
            "Mime-Version": "1.0 (Mac OS X Mail 16.0 \\(3826.200.121\\))",
            "_msgid_domain": "university.example",
        },
    )
