"""Thin views: the admin's Worker health page and the /metrics scrape endpoint."""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlencode

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, HttpResponseNotFound
from django.template.response import TemplateResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST

from ops.conf import get_config
from ops.health import worker_health
from ops.metrics import render_metrics
from ops.ranges import RANGES, parse_range

# The page refreshes itself this often (seconds) unless ?refresh= says otherwise (0: never).
REFRESH_SECONDS = 30
REFRESH_MAX_SECONDS = 3600


def refresh_seconds(value: str | None) -> int:
    """`?refresh=` as whole seconds, 0 (off) to an hour; anything else is the default."""
    if value is None or not value.isdigit() or len(value) > 4:
        return REFRESH_SECONDS
    return min(int(value), REFRESH_MAX_SECONDS)


def health_view(request: HttpRequest) -> TemplateResponse:
    """Staff only: wrapped in admin.site.admin_view by the URLconf.

    `?range=1h|24h|7d` picks the charts' window (an unknown value shows the default and
    says so); `?refresh=N` the self-refresh interval, kept in the range links."""
    chart_range, range_notice = parse_range(request.GET.get("range"))
    refresh = refresh_seconds(request.GET.get("refresh"))
    keep = {"refresh": str(refresh)} if "refresh" in request.GET else {}
    ranges = [
        {
            "key": r.key,
            "label": r.label,
            "url": "?" + urlencode({"range": r.key, **keep}),
            "current": r.key == chart_range.key,
        }
        for r in RANGES.values()
    ]
    context = {
        **admin.site.each_context(request),
        "title": "Worker health",
        "health": worker_health(chart_range=chart_range),
        "ranges": ranges,
        "range_notice": range_notice,
        "refresh_seconds": refresh,
    }
    return TemplateResponse(request, "ops/worker_health.html", context)


def _digest(value: str) -> bytes:
    # Equal-length digests: compare_digest then takes the same time whatever the lengths.
    return hashlib.sha256(value.encode()).digest()


def _bearer(request: HttpRequest) -> str:
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else ""


@csrf_exempt  # it only reads: without this, CSRF answered a POST 403 before require_safe
@never_cache
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """A plain 404 while METRICS_TOKEN is unset (the endpoint does not exist; never Django's
    DEBUG page, which lists the URLconf); 405 for anything but GET/HEAD; 401 without the right
    `Authorization: Bearer <token>`; else the figures in Prometheus' text format."""
    token = get_config().metrics_token
    if not token:
        return HttpResponseNotFound("Not Found\n", content_type="text/plain")
    supplied = _bearer(request)
    if not supplied or not hmac.compare_digest(_digest(supplied), _digest(token)):
        response = HttpResponse("metrics token missing or wrong\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(render_metrics(), content_type=CONTENT_TYPE_LATEST)
