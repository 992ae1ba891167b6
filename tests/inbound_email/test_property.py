"""Property: whatever bytes arrive, the poller never raises and every object ends processed,
rejected or quarantined (I6, I7)."""

from __future__ import annotations

import base64
import itertools

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from inbound_email.models import InboundEmail
from inbound_email.poller import poll_once
from jobs import run_pending
from tests.support.mail import build_mail

pytestmark = pytest.mark.django_db

FINAL = {"processed", "rejected", "quarantined"}
_keys = itertools.count()

CHARSETS = ["unknown-8bit", "utf-8", "x-garbage", "rot13", "base64", "", "iso-8859-8-i", "utf\x00"]


def templates(token: str) -> list[bytes]:
    plain = build_mail(token=token, body="Rating: 4 stars\nPlease cut the budget by 5%.")
    b64 = base64.b64encode("Rating: 2\nRéécrire l'introduction, merci.".encode()).decode()
    multipart = (
        f"From: pi@university.example\r\nTo: replies+{token}@reply.localhost\r\n"
        "Subject: =?utf-8?b?UmU6IHByb3Bvc2Fs?=\r\nMIME-Version: 1.0\r\n"
        'Content-Type: multipart/alternative; boundary="b1"\r\n\r\n'
        "--b1\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n"
        f"\r\n{b64}\r\n--b1\r\nContent-Type: text/html\r\n\r\n<p>5</p>\r\n--b1--\r\n"
    ).encode()
    return [plain, multipart]


@st.composite
def mail_bytes(draw, bases: list[bytes]) -> bytes:
    kind = draw(st.sampled_from(["random", "mutated", "charset", "header"]))
    if kind == "random":
        return draw(st.binary(max_size=3000))
    # A fresh Message-ID first, so most mails get past de-duplication into validation.
    fresh_id = f"Message-ID: <{draw(st.uuids()).hex}@prop.example>\r\n".encode()
    base = bytearray(fresh_id + draw(st.sampled_from(bases)))
    if kind == "charset":
        charset = draw(st.sampled_from(CHARSETS) | st.text(max_size=20))
        body = draw(st.binary(max_size=300))
        head = bytes(base).split(b"\r\n\r\n", 1)[0]
        head = b"\r\n".join(
            line for line in head.split(b"\r\n") if not line.lower().startswith(b"content-")
        )
        ctype = f"Content-Type: text/plain; charset={charset}".encode("utf-8", "surrogateescape")
        return head + b"\r\n" + ctype + b"\r\nContent-Transfer-Encoding: 8bit\r\n\r\n" + body
    if kind == "header":
        name = draw(st.sampled_from([b"Subject", b"From", b"Date", b"Message-ID", b"In-Reply-To"]))
        value = draw(st.binary(max_size=200))
        return name + b": " + value + b"\r\n" + bytes(base)
    for _ in range(draw(st.integers(1, 8))):  # mutated: flips, cuts, insertions
        op = draw(st.sampled_from(["flip", "cut", "insert"]))
        pos = draw(st.integers(0, max(0, len(base) - 1)))
        if op == "flip" and base:
            base[pos] = draw(st.integers(0, 255))
        elif op == "cut":
            del base[pos : pos + draw(st.integers(1, 200))]
        else:
            base[pos:pos] = draw(st.binary(min_size=1, max_size=50))
    return bytes(base)


@pytest.mark.slow
def test_poller_never_raises_and_every_object_ends_final(
    folder_store, make_notification, settings, django_capture_on_commit_callbacks
):
    settings.MAX_REPLIES_PER_TOKEN_PER_HOUR = 100_000
    token = make_notification().token

    @hsettings(
        max_examples=40,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(mails=st.lists(mail_bytes(templates(token)), min_size=1, max_size=4))
    def run(mails: list[bytes]) -> None:
        keys = [f"h{next(_keys):06d}" for _ in mails]
        for key, data in zip(keys, mails, strict=True):
            folder_store.put(key, data)
        with django_capture_on_commit_callbacks(execute=True):
            poll_once()
            run_pending()  # instructions relayed (Slack off: database inbox)
        statuses = dict(
            InboundEmail.objects.filter(store_key__in=keys).values_list("store_key", "status")
        )
        assert set(statuses) == set(keys)
        assert set(statuses.values()) <= FINAL, statuses
        assert not [o for page in folder_store.list() for o in page]

    run()
