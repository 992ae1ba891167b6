"""Mail as a PI's client would send it: the raw bytes the inbound tests put in a store."""

from __future__ import annotations

from collections.abc import Callable
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid

from django.utils import timezone

from notifications.reply_address import reply_address_for

PI_ADDRESS = "pi@university.example"


def build_mail(
    *,
    token: str | None = None,
    sender: str = PI_ADDRESS,
    body: str = "4\nPlease tighten the budget section.",
    subject: str = "Re: Your proposal",
    headers: dict[str, str] | None = None,
    message_id: str | None = None,
    to: str | None = None,
    attach: Callable[[EmailMessage], None] | None = None,
) -> bytes:
    """A reply as a PI's mail client would send it, as raw bytes; `attach` adds parts to
    the message (see `with_attachments`)."""
    msg = EmailMessage()
    msg["From"] = f"Ada Lovelace <{sender}>"
    msg["To"] = to or (reply_address_for(token) if token else "replies@reply.localhost")
    msg["Subject"] = subject
    msg["Date"] = format_datetime(timezone.now())
    msg["Message-ID"] = message_id or make_msgid(domain="university.example")
    for name, value in (headers or {}).items():
        msg[name] = value
    msg.set_content(
        body + "\n\nOn Mon, 1 Dec 2026, Assistant wrote:\n> Please rate this proposal\n"
    )
    if attach is not None:
        attach(msg)
    return msg.as_bytes()


PDF = b"%PDF-1.4\n1 0 obj<</Type/Catalog>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n" * 20
PNG = (
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06"
    b"\x00\x00\x00\x1f\x15\xc4\x89\x00\x00\x00\rIDATx\x9cc\xf8\x0f\x00\x00\x01\x01"
    b"\x00\x05\x18\xd8N\x00\x00\x00\x00IEND\xaeB`\x82"
)


def forwarded_mail() -> EmailMessage:
    """A mail attached as message/rfc822 (a PI forwarding a colleague's comments)."""
    inner = EmailMessage()
    inner["From"] = "Grace Hopper <grace@university.example>"
    inner["To"] = PI_ADDRESS
    inner["Subject"] = "My comments on the budget"
    inner.set_content("The travel budget looks too high to me.\n")
    return inner


def with_attachments(
    *,
    pdf_name: str | None = "comments.pdf",
    inline_image: bool = False,
    forwarded: bool = False,
    extra: list[tuple[str, bytes, str]] = (),
) -> Callable[[EmailMessage], None]:
    """`attach` for build_mail: a PDF (under `pdf_name`), an inline image referenced from an
    HTML alternative (multipart/related, as Apple Mail and Gmail send it), an attached mail
    (message/rfc822), and `extra` files (name, bytes, "type/subtype")."""

    def attach(msg: EmailMessage) -> None:
        if inline_image:
            text = msg.get_content()
            msg.add_alternative(f'<p>{text}</p><p><img src="cid:figure1@pi"></p>', subtype="html")
            html = msg.get_payload()[1]
            html.add_related(PNG, "image", "png", cid="<figure1@pi>", filename="figure 1.png")
        if pdf_name is not None:
            msg.add_attachment(PDF, maintype="application", subtype="pdf", filename=pdf_name)
        if forwarded:
            msg.add_attachment(forwarded_mail())
        for name, data, ctype in extra:
            maintype, _, subtype = ctype.partition("/")
            msg.add_attachment(data, maintype=maintype, subtype=subtype, filename=name)

    return attach
