"""The ops pages: the admin's Worker health page (staff only) and /metrics (token)."""

from django.contrib import admin
from django.urls import path

from ops import views

app_name = "ops"

urlpatterns = [
    path("admin/worker-health/", admin.site.admin_view(views.health_view), name="worker_health"),
    path("metrics", views.metrics_view, name="metrics"),
]
