"""The worker serves the Django admin (with the ops Worker health page), /metrics, the
one-click unsubscribe (/unsubscribe/<token>) and the SES events endpoint (/ses/events); the web
app owns every other page."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", include("ops.urls")),  # before admin/: admin/worker-health/ is ours
    path("", include("notifications.urls")),  # /ses/events (SNS)
    path("admin/", admin.site.urls),
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
]
