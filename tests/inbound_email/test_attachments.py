"""Which parts of a mail are attachments, and the names they get (issue 21.1), without a
database: a PDF, an inline image, an attached mail, hostile file names."""

from __future__ import annotations

import hashlib
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inbound_email.attachments import (
    FILENAME_MAX_CHARS,
    STORED_NAME_MAX_BYTES,
    safe_filename,
    stored_name,
)
from inbound_email.parsing import parse_mail
from tests.support.mail import PDF, PNG, build_mail, with_attachments

HOSTILE_NAME = b"filename*=utf-8''..%2F..%2Fetc%5Cevil%0D%0A%01rep%00ort%7F.pdf"


def hostile_named_pdf_mail() -> bytes:
    """A PDF whose file name (RFC 2231) climbs out of any folder and carries CR, LF, NUL,
    DEL and a control character."""
    raw = build_mail(
        token="abc",
        body="Please see my comments attached.",
        attach=with_attachments(pdf_name="PLACEHOLDER.pdf", inline_image=True, forwarded=True),
    )
    return raw.replace(b'filename="PLACEHOLDER.pdf"', HOSTILE_NAME)


def test_a_pdf_an_inline_image_and_an_attached_mail_are_attachments_and_the_body_is_not():
    mail = parse_mail(hostile_named_pdf_mail())

    assert mail.text.startswith("Please see my comments attached.")
    found = [(a.index, a.filename, a.content_type, a.inline) for a in mail.attachments]
    assert found == [
        (1, "figure 1.png", "image/png", True),  # inline, referenced by cid from the HTML
        (2, "evilreport.pdf", "application/pdf", False),
        (3, "My comments on the budget.eml", "message/rfc822", False),
    ]
    image, pdf, forwarded = mail.attachments
    assert image.data == PNG and pdf.data == PDF
    assert (pdf.size, pdf.sha256) == (len(PDF), hashlib.sha256(PDF).hexdigest())
    # The attached mail is kept whole, as an .eml; its own text is not the reply's body.
    assert b"The travel budget looks too high to me." in forwarded.data
    assert "travel budget" not in mail.text


def test_a_plain_reply_has_no_attachments():
    assert parse_mail(build_mail(token="abc", body="Please shorten it.")).attachments == []


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("../../etc/passwd", "passwd"),
        ("C:\\Users\\ada\\report.pdf", "report.pdf"),
        ("re\x00port\x07\x1b[31m.pdf", "report[31m.pdf"),
        ("line\r\nbreak.pdf", "linebreak.pdf"),
        ("  ..hidden.pdf ", "hidden.pdf"),
        ("CON", "CON_"),
        ("r\u00e9sum\u00e9 \u2014 v2.pdf", "r\u00e9sum\u00e9 \u2014 v2.pdf"),
        ("", "attachment-4.pdf"),
        ("/", "attachment-4.pdf"),
        ("a/b/..", "attachment-4.pdf"),
    ],
)
def test_file_names_lose_path_separators_and_control_characters(name, expected):
    assert safe_filename(name, index=4, content_type="application/pdf") == expected


def test_a_long_file_name_is_cut_keeping_its_extension():
    name = safe_filename("x" * 500 + ".docx", index=1, content_type="application/octet-stream")
    assert len(name) == FILENAME_MAX_CHARS and name.endswith("x.docx")


@pytest.mark.parametrize("index", [1, 12, 100])
def test_a_name_whose_stored_form_is_exactly_255_bytes_is_kept_whole_and_one_more_is_cut(index):
    """Issue 28.1: the key's last part, `<index>-<name>`, prefix included, is at most 255
    bytes of UTF-8 (pathvalidate cut the name alone to 255, and `.pdf` went with it)."""
    prefix = len(f"{index}-")
    stem = "\u4e2d" * ((STORED_NAME_MAX_BYTES - prefix - 4) // 3)
    stem += "x" * ((STORED_NAME_MAX_BYTES - prefix - 4) % 3)  # exactly 255 with ".pdf"
    exact = safe_filename(stem + ".pdf", index=index, content_type="application/pdf")
    longer = safe_filename("\u4e2d" + stem + ".pdf", index=index, content_type="application/pdf")

    assert exact == stem + ".pdf"
    assert len(stored_name(index=index, filename=exact).encode()) == STORED_NAME_MAX_BYTES
    assert longer.endswith(".pdf") and len(longer) < len(stem) + 5
    assert len(stored_name(index=index, filename=longer).encode()) <= STORED_NAME_MAX_BYTES


def test_a_cut_never_separates_a_character_from_its_combining_marks():
    name = "r\u00e9sume\u0301 " + "\u0915\u094d\u0937\u093f" * 40 + ".pdf"  # Devanagari
    cut = safe_filename(name, index=1, content_type="application/pdf")

    stem = cut.removesuffix(".pdf")
    assert cut.endswith(".pdf") and name.startswith(stem)
    assert name[len(stem)] == "\u0915"  # the cut-off part starts with a base character


@settings(max_examples=300, deadline=None)
@given(
    stem=st.text(st.characters(categories=["L", "M", "N", "So"]), min_size=1, max_size=300),
    index=st.integers(min_value=1, max_value=100),
)
def test_any_name_in_any_script_fits_its_key_and_keeps_its_extension(stem, index):
    """Issue 28.1, as a property: whatever the letters, marks, digits and symbols, the key's
    last part is at most 255 bytes, `.pdf` stays, and a cut name is a beginning of the
    sender's cut where a new character sequence starts."""
    name = safe_filename(stem + ".pdf", index=index, content_type="application/pdf")

    assert len(stored_name(index=index, filename=name).encode()) <= STORED_NAME_MAX_BYTES
    assert name.endswith(".pdf")
    kept = name.removesuffix(".pdf")
    if kept != stem and not name.startswith("attachment-") and stem.startswith(kept):
        assert unicodedata.combining(stem[len(kept)]) == 0


def test_body_text_past_the_first_part_is_kept_as_an_attachment():
    """Apple Mail sends "text, image, text" when an image sits inside the reply; a mailing
    list appends a footer part. Only the first text part is the body: the rest used to be
    lost with the raw source. The HTML rendering of the body is not an attachment."""
    from email.message import EmailMessage

    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = "pi@university.example", "r@x.example", "Re: x"
    msg.set_content("Please see the figure:")
    msg.add_alternative("<p>Please see the figure:</p>", subtype="html")
    msg.make_mixed()
    msg.add_attachment(PNG, maintype="image", subtype="png", disposition="inline")
    rest = EmailMessage()
    rest.set_content("and shorten section 3.")
    msg.attach(rest)

    mail = parse_mail(msg.as_bytes())

    assert mail.text.startswith("Please see the figure:")
    found = [(a.filename, a.content_type, a.data) for a in mail.attachments]
    assert found == [
        ("attachment-1.png", "image/png", PNG),
        ("attachment-2.txt", "text/plain", b"and shorten section 3.\n"),
    ]


def test_a_body_longer_than_the_reader_keeps_is_recorded_as_kept_in_raw():
    """The reader keeps the first 200,000 characters of the body (MAX_BODY_CHARS); the rest
    would be lost once the raw source is cleared: the body is recorded as kept in raw."""
    from inbound_email.parsing import MAX_BODY_CHARS

    body = "Please revise.\n" + "x" * MAX_BODY_CHARS + "\nTHE END"
    mail = parse_mail(build_mail(token="abc", body=body))

    assert len(mail.text) == MAX_BODY_CHARS and "THE END" not in mail.text
    (whole,) = mail.attachments
    assert (whole.filename, whole.content_type, whole.kept_in_raw) == (
        "message-body.txt",
        "text/plain",
        True,
    )
    assert b"THE END" in whole.data
