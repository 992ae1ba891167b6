"""Thin views: the admin's Worker health page and the /metrics scrape endpoint."""

from __future__ import annotations

import hashlib
import hmac

from django.contrib import admin
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST

from ops.conf import get_config
from ops.health import worker_health
from ops.metrics import render_metrics


def health_view(request: HttpRequest) -> TemplateResponse:
    """Staff only: wrapped in admin.site.admin_view by the URLconf."""
    context = {
        **admin.site.each_context(request),
        "title": "Worker health",
        "health": worker_health(),
    }
    return TemplateResponse(request, "ops/worker_health.html", context)


def _digest(value: str) -> bytes:
    # Equal-length digests: compare_digest then takes the same time whatever the lengths.
    return hashlib.sha256(value.encode()).digest()


def _bearer(request: HttpRequest) -> str:
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else ""


@never_cache
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """404 while METRICS_TOKEN is unset (the endpoint does not exist); 401 without the right
    `Authorization: Bearer <token>`; else the figures in Prometheus' text format."""
    token = get_config().metrics_token
    if not token:
        raise Http404("metrics are off")
    supplied = _bearer(request)
    if not supplied or not hmac.compare_digest(_digest(supplied), _digest(token)):
        response = HttpResponse("metrics token missing or wrong\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(render_metrics(), content_type=CONTENT_TYPE_LATEST)
