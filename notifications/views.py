"""The HTTP endpoints of the notifications app: SES event notifications through SNS."""

from __future__ import annotations

import logging

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_POST

from notifications import ses_events
from notifications.unsubscribe import InvalidLink, notification_for_link, unsubscribe_by_link

logger = logging.getLogger(__name__)


@csrf_exempt  # SNS cannot send a CSRF token; the message's signature and topic are checked
@require_POST
def ses_events_view(request: HttpRequest) -> HttpResponse:
    """SNS posts SES's bounce, complaint and delivery events here (404 until an operator
    sets SES_EVENTS_TOPIC_ARNS)."""
    if not ses_events.topic_arns():
        raise Http404("SES events are off")
    try:
        message = ses_events.parse_message(_bounded_body(request))
        ses_events.verify(message)
        handled = ses_events.handle(message, now=timezone.now())
    except ses_events.Refused as exc:
        # Said once here, without a traceback: bad input is the sender's doing (issue 28.4).
        logger.warning(
            "SES event refused (%s): %s",
            exc.status,
            exc,
            extra={"action": "ses_event_refused", "status": exc.status},
        )
        response = HttpResponse(str(exc), status=exc.status, content_type="text/plain")
        response._has_been_logged = True  # noqa: SLF001 - Django's flag: no second ERROR line
        return response
    return JsonResponse({"handled": handled.what, "recorded": handled.recorded})


def _bounded_body(request: HttpRequest) -> bytes:
    """The body, read no further than SES_EVENTS_MAX_BODY_BYTES + 1 (parse_message refuses a
    longer one; request.body would raise RequestDataTooBig past DATA_UPLOAD_MAX_MEMORY_SIZE,
    an ERROR with a traceback)."""
    limit = ses_events.get_config().ses_events_max_body_bytes
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        raise ses_events.Refused(400, "body too large for an SNS message")  # left unread
    return request.read(limit + 1)


@csrf_exempt  # RFC 8058: the mailbox provider POSTs with no cookie and no CSRF token
@require_http_methods(["GET", "HEAD", "POST"])
def unsubscribe_view(request: HttpRequest, token: str) -> HttpResponse:
    """One-click unsubscribe. POST (the provider's button, or our confirm page) pauses the
    PI's mail, no login needed; GET only shows a confirm page with one button (a link
    scanner that follows GETs must not unsubscribe anyone). Idempotent."""
    try:
        if request.method == "POST":
            unsubscribe_by_link(token)
            logger.info("unsubscribed by link", extra={"action": "notification_unsubscribed"})
            return render(request, "notifications/unsubscribe_done.html", status=200)
        notification = notification_for_link(token)
    except InvalidLink as exc:
        return render(
            request, "notifications/unsubscribe_invalid.html", {"reason": str(exc)}, status=404
        )
    return render(
        request,
        "notifications/unsubscribe_confirm.html",
        {"name": notification.user.get_full_name() or notification.user.get_username()},
    )
