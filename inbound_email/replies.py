"""Pure rules about reply content: the rating, the instruction, auto-reply detection.

No database here, so the rules are tested on their own. The old poller compared a rating
taken from mail with an int (`rating < 1`) and raised TypeError on a string (COR-19); here a
rating is coerced to an int 1-5 or rejected with a reason, never compared raw (I7).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from inbound_email.auto_replies import automatic_reply_detail
from inbound_email.exceptions import InvalidRating
from inbound_email.parsing import ParsedMail
from notifications.reply_address import token_from_address

RATING_MIN, RATING_MAX = 1, 5
_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5}
_LABEL_RE = re.compile(r"^\s*(?:rating|score|stars?)\s*[:=\-]?\s*(?P<value>.*)$", re.IGNORECASE)
_VALUE_RE = re.compile(
    r"^\s*(?P<n>[+-]?\d+(?:[.,]\d+)?|one|two|three|four|five)\s*"
    r"(?:(?:/|out\s+of|of)\s*(?P<scale>\d+))?\s*(?:stars?|\*+)?\s*[.!]*\s*$",
    re.IGNORECASE,
)
_BARE_RE = re.compile(r"^\s*(?:\d|one|two|three|four|five)\b", re.IGNORECASE)


def coerce_rating(value: object) -> int:
    """An int 1-5 from 4, "4", "4/5", "4 out of 5", "Rating: 4 stars", "four"; else InvalidRating.

    The reason in InvalidRating is shown to operators, so it quotes what was sent.
    """
    if isinstance(value, bool):
        raise InvalidRating(f"rating {value!r} is not a number 1-5")
    if isinstance(value, int):
        number = value
    elif isinstance(value, float):
        if not value.is_integer():
            raise InvalidRating(f"rating {value!r} is not a whole number 1-5")
        number = int(value)
    elif isinstance(value, str):
        text = value.strip()
        label = _LABEL_RE.match(text)
        if label:
            text = label.group("value")
        match = _VALUE_RE.match(text)
        if not match:
            raise InvalidRating(f"rating {value.strip()[:40]!r} is not a number 1-5")
        raw = match.group("n").lower().replace(",", ".")
        if raw in _WORDS:
            number = _WORDS[raw]
        else:
            as_float = float(raw)
            if not as_float.is_integer():
                raise InvalidRating(f"rating {value.strip()[:40]!r} is not a whole number 1-5")
            number = int(as_float)
        scale = match.group("scale")
        # int() refuses more than 4,300 digits (ValueError); no scale of 5 needs more than a few.
        digits = scale.lstrip("0") if scale is not None else ""
        if scale is not None and (len(digits) > 9 or int(digits or "0") != RATING_MAX):
            raise InvalidRating(f"rating {value.strip()[:40]!r} is not on a scale of 5")
    else:
        raise InvalidRating(f"rating of type {type(value).__name__} is not a number 1-5")
    if not RATING_MIN <= number <= RATING_MAX:
        raise InvalidRating(f"rating {number} is outside 1-5")
    return number


@dataclass(frozen=True)
class ReplyContent:
    rating: int | None
    rating_error: str  # why a rating line was not accepted ("" when none or accepted)
    instruction: str


def split_reply(reply_text: str) -> ReplyContent:
    """Read a rating from the first non-empty line; the rest is the instruction.

    A first line counts as a rating when it is labelled ("Rating: ...", "Score: ...") or
    starts with a digit or a number word ("4", "4/5", "five stars"). A labelled line that does
    not coerce is rejected with a reason and removed from the instruction.
    """
    lines = reply_text.strip().splitlines()
    if not lines:
        return ReplyContent(None, "", "")
    first, rest = lines[0].strip(), "\n".join(lines[1:]).strip()
    labelled = _LABEL_RE.match(first) is not None
    if not labelled and not _BARE_RE.match(first):
        return ReplyContent(None, "", reply_text.strip())
    try:
        return ReplyContent(coerce_rating(first), "", rest)
    except InvalidRating as exc:
        if labelled:
            return ReplyContent(None, str(exc), rest)
        # "3 things to change: ..." is an instruction, not a rating.
        return ReplyContent(None, "", reply_text.strip())


_BOUNCE_SUBJECT_RE = re.compile(
    r"^\s*(undeliverable|undelivered mail|delivery status notification|mail delivery failed)",
    re.IGNORECASE,
)
_BOUNCE_SENDERS = ("mailer-daemon", "postmaster", "mail-daemon")


def auto_reply_reason(mail: ParsedMail) -> tuple[str, str] | None:
    """("bounce" | "auto_reply", detail) when the mail was not written by a person (I10).

    Automatic replies (out of office, ticket systems, Exchange) are `auto_replies`' rules.
    """
    local = mail.from_address.partition("@")[0]
    if local in _BOUNCE_SENDERS or mail.content_type == "multipart/report":
        return "bounce", f"bounce from {local or 'an empty sender'} ({mail.content_type})"
    if mail.header("Return-Path").strip() == "<>":
        return "bounce", "null Return-Path (<>): a delivery notification"
    automatic = automatic_reply_detail(mail.headers, mail.subject)
    if automatic is not None:
        return "auto_reply", automatic
    if _BOUNCE_SUBJECT_RE.match(mail.subject):
        return "auto_reply", f"subject looks automatic: {mail.subject[:60]!r}"
    return None


def header_rejection(mail: ParsedMail) -> tuple[str, str] | None:
    """(reason, detail) when the header fields alone already decide that the mail will be
    rejected: an auto-reply or bounce, no reply token anywhere, or not exactly one From.

    Meant for the result of `parse_headers`: such a mail never has its body parsed (issue 10).
    It mirrors the first checks of the full acceptance, which still runs on every mail and
    stays the one that decides; this only lets it skip the expensive part.
    """
    auto = auto_reply_reason(mail)
    if auto is not None:
        return auto
    if not mail.in_reply_to and not any(token_from_address(a) for a in mail.recipients):
        return "no_token", "no reply token in the recipients or In-Reply-To"
    if mail.from_count != 1:
        return "sender_mismatch", f"{mail.from_count} From addresses"
    return None
