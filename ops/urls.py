"""The ops pages: the admin's Worker health page (staff only) and /metrics (token)."""

from django.contrib import admin
from django.http import HttpResponse
from django.urls import path
from django.views.decorators.cache import cache_control

from ops import views

app_name = "ops"

urlpatterns = [
    path("admin/worker-health/", admin.site.admin_view(views.health_view), name="worker_health"),
    path("metrics", views.metrics_view, name="metrics"),
    # Browsers ask for it on every admin page; a 404 is a console error on each (issue 20).
    path(
        "favicon.ico",
        cache_control(max_age=86400)(lambda request: HttpResponse(status=204)),
        name="favicon",
    ),
]
