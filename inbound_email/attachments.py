"""The attachments of a parsed mail (pure, no I/O): which parts are files, their safe names.

A PI's reply may carry what the instruction refers to ("see my comments attached"): a PDF,
an inline image, a forwarded mail. Every such part is kept (issue 21): it is stored, recorded
on the reply and relayed with the instruction. Which parts count:

* a part whose Content-Disposition is `attachment`, or that has a file name;
* any other leaf part that is not text (an inline image with a Content-ID, audio, ...);
* a `message/rfc822` part as a whole (an attached mail), as an .eml file: it is not opened,
  its own parts stay inside it.

The body text (the first text/plain or text/html that is not an attachment) and the other
renderings of it are not attachments; any further text is (`mail_attachments`). File names
come from the sender and are sanitised (`safe_filename`): never a path, never a control
character.
"""

from __future__ import annotations

import hashlib
import mimetypes
import re
import unicodedata
from dataclasses import dataclass
from email.message import Message

from pathvalidate import sanitize_filename

from inbound_email.decoding import clean_text, decode_header_value, raw_to_str

FILENAME_MAX_CHARS = 150  # of a sanitised file name, its extension included
# Of the stored key's last part, `<index>-<file name>`, in UTF-8: what a file system takes
# as one name (ext4, XFS, APFS), so the folder store and S3 hold the same keys (issue 28.1).
STORED_NAME_MAX_BYTES = 255
_EXTENSION_MAX_CHARS = 16
# Joined to the character before them: a cut never falls just before one.
_JOINERS = frozenset("\u200c\u200d")
_VIRAMA = 9  # the canonical combining class of a virama (Indic scripts)
_SPACES_RE = re.compile(r"\s+")


@dataclass(frozen=True)
class MailAttachment:
    """One attachment as found in the mail; `data` is the decoded content."""

    index: int  # 1-based, in the order of the mail
    filename: str  # sanitised
    content_type: str
    data: bytes
    inline: bool  # shown inside the mail (Content-Disposition inline / a Content-ID)
    # The body itself, longer than the reader keeps: recorded, left in the raw source only.
    kept_in_raw: bool = False

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def stored_name(*, index: int, filename: str) -> str:
    """The last part of an attachment's store key: `<index>-<file name>`."""
    return f"{index}-{filename}"


def _cut(text: str, *, max_chars: int, max_bytes: int) -> str:
    """The longest beginning of `text` within `max_chars` characters and `max_bytes` of
    UTF-8, cut between characters and never inside a combining sequence (a letter and its
    accents, a ZWJ emoji, a variation selector): the part cut off starts a sequence."""
    end, size = 0, 0
    for char in text[:max_chars]:
        size += len(char.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            break
        end += 1
    while 0 < end < len(text) and _continues(text, end):
        end -= 1
    return text[:end]


def _continues(text: str, end: int) -> bool:
    """Whether text[end] belongs to the character sequence before it."""
    char, before = text[end], text[end - 1]
    return (
        unicodedata.combining(char) != 0
        or unicodedata.category(char) in ("Mn", "Mc", "Me")
        or "\ufe00" <= char <= "\ufe0f"  # variation selectors
        or "\U0001f3fb" <= char <= "\U0001f3ff"  # emoji skin tones
        or char in _JOINERS
        or before in _JOINERS
        or unicodedata.combining(before) == _VIRAMA  # a conjunct: क्ष is one letter
    )


def _fit(stem: str, ext: str, max_bytes: int) -> str:
    """`stem.ext` within FILENAME_MAX_CHARS characters and `max_bytes` of UTF-8: the stem is
    cut, the extension kept."""
    suffix = f".{ext}" if ext else ""
    text = stem + suffix
    if len(text) <= FILENAME_MAX_CHARS and len(text.encode("utf-8")) <= max_bytes:
        return text
    stem = _cut(
        stem,
        max_chars=FILENAME_MAX_CHARS - len(suffix),
        max_bytes=max_bytes - len(suffix.encode("utf-8")),
    )
    return stem.rstrip(". ") + suffix


def safe_filename(name: str, *, index: int, content_type: str) -> str:
    """A file name a store key, a download and Slack can take: the sender's last path
    component (either separator), without control characters, reserved names, leading dots
    or surrounding blanks (pathvalidate), cut to FILENAME_MAX_CHARS and so that the key's
    last part (`stored_name`) is at most STORED_NAME_MAX_BYTES of UTF-8, keeping the
    extension. An empty result becomes `attachment-<index>` with the content type's
    extension."""
    max_bytes = STORED_NAME_MAX_BYTES - len(stored_name(index=index, filename="").encode())
    text = clean_text(name or "")
    text = re.split(r"[/\\]", text)[-1]
    text = "".join(ch for ch in text if ch.isprintable())
    text = _SPACES_RE.sub(" ", text).strip().lstrip(". ")
    stem, dot, ext = text.rpartition(".")
    if not dot or not stem or len(ext) > _EXTENSION_MAX_CHARS:
        stem, ext = text, ""
    text = _fit(stem, ext, max_bytes)
    # pathvalidate's own cut (255 bytes) no longer applies: the name already fits.
    text = sanitize_filename(text, platform="universal", max_len=max_bytes)
    text = text.strip().lstrip(". ")
    if not text.strip(". "):
        extension = mimetypes.guess_extension(content_type) or ".bin"
        if content_type == "message/rfc822":
            extension = ".eml"
        text = f"attachment-{index}{extension}"
    return text


def _disposition(part: Message) -> str:
    for name, value in part.raw_items():
        if str(name).lower() == "content-disposition":
            return raw_to_str(value).strip().lower()
    return ""


def _filename(part: Message) -> str:
    try:
        name = part.get_filename() or part.get_param("name") or ""
    except (ValueError, TypeError, LookupError, UnicodeError, IndexError):
        return ""
    if isinstance(name, tuple):  # an RFC 2231 value the stdlib left undecoded
        name = name[2] if len(name) == 3 else ""
    text = raw_to_str(name)
    if "=?" in text:  # RFC 2047 encoded words, which Outlook and Gmail use in file names
        text = decode_header_value(text)
    return text  # control characters are dropped by safe_filename, not turned into blanks


def _content_type(part: Message) -> str:
    try:
        return (part.get_content_type() or "application/octet-stream").lower()
    except (ValueError, TypeError, AttributeError, IndexError):
        return "application/octet-stream"


def _data(part: Message, content_type: str) -> bytes:
    if content_type == "message/rfc822":
        payload = part.get_payload()
        inner = payload[0] if isinstance(payload, list) and payload else None
        if isinstance(inner, Message):
            try:
                return inner.as_bytes()
            except (ValueError, TypeError, LookupError, UnicodeError):
                pass
        raw = part.get_payload()
        return raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else b""
    try:
        data = part.get_payload(decode=True)
    except (ValueError, TypeError, LookupError, UnicodeError, AssertionError):
        data = None
    if isinstance(data, bytes):
        return data
    raw = part.get_payload()
    return raw.encode("ascii", "surrogateescape") if isinstance(raw, str) else b""


def _attached_subject(part: Message) -> str:
    """The Subject of an attached mail: its file name when the sender gave none."""
    payload = part.get_payload()
    inner = payload[0] if isinstance(payload, list) and payload else None
    if not isinstance(inner, Message):
        return ""
    return decode_header_value(inner.get("Subject", ""))[:100]


def _leaves(message: Message, alternative: int | None = None) -> list[tuple[Message, int | None]]:
    """Leaf parts in order, each with the id of its outermost multipart/alternative ancestor
    (None: none); an attached mail (message/rfc822) is one leaf, never opened."""
    if _content_type(message) == "message/rfc822" or not message.is_multipart():
        return [(message, alternative)]
    if alternative is None and _content_type(message) == "multipart/alternative":
        alternative = id(message)
    leaves: list[tuple[Message, int | None]] = []
    payload = message.get_payload()
    for part in payload if isinstance(payload, list) else []:
        if isinstance(part, Message):
            leaves.extend(_leaves(part, alternative))
    return leaves


def _is_body_text(part: Message) -> bool:
    """A text part that is not an attachment: what `parsing.body_text` may read as the body."""
    return _content_type(part).startswith("text/") and not _disposition(part).startswith(
        "attachment"
    )


def mail_attachments(
    message: Message, *, body_max_bytes: int | None = None
) -> list[MailAttachment]:
    """Every attachment of a parsed mail, in order (see the module docstring for which).

    The body is the first text/plain body part, else the first text/html one (as
    `parsing.body_text` reads it); the other renderings of it (the parts under the same
    multipart/alternative) are not attachments. Any further body text (a second text part
    after an inline image, a footer a list added, a text/calendar) is kept as an attachment,
    so that no text of the mail is lost when its raw source is cleared. A body longer than
    `body_max_bytes` (the reader keeps only its beginning) is recorded too, `kept_in_raw`:
    its mail's raw source is then kept.
    """
    leaves = _leaves(message)
    texts = [(part, alt) for part, alt in leaves if _is_body_text(part)]
    body = next((t for t in texts if _content_type(t[0]) == "text/plain"), None) or next(
        (t for t in texts if _content_type(t[0]) == "text/html"), None
    )
    found: list[MailAttachment] = []
    for part, alternative in leaves:
        content_type = _content_type(part)
        disposition = _disposition(part)
        name = _filename(part)
        kept_in_raw = False
        if body is not None and _is_body_text(part):
            if part is body[0] and body_max_bytes is not None:
                kept_in_raw = len(_data(part, content_type)) > body_max_bytes
            if not kept_in_raw and (
                part is body[0] or (alternative is not None and alternative == body[1])
            ):
                continue  # the body, or another rendering of it
            if kept_in_raw:
                name = "message-body.html" if content_type == "text/html" else "message-body.txt"
        if not name and content_type == "message/rfc822":
            name = _attached_subject(part)
            name = f"{name}.eml" if name else ""
        index = len(found) + 1
        found.append(
            MailAttachment(
                index=index,
                filename=safe_filename(name, index=index, content_type=content_type),
                content_type=content_type[:200],
                data=_data(part, content_type),
                inline=disposition.startswith("inline") or bool(part.get("Content-ID")),
                kept_in_raw=kept_in_raw,
            )
        )
    return found
