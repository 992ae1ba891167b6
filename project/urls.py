"""The worker serves the Django admin (with the ops Worker health page), /metrics, the
one-click unsubscribe (/unsubscribe/<token>) and the SES events endpoint (/ses/events); the web
app owns every other page."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

# The admin index links the Worker health page (ops/templates/ops/admin_index.html).
admin.site.index_template = "ops/admin_index.html"

urlpatterns = [
    path("", include("ops.urls")),  # before admin/: admin/worker-health/ is ours
    path("", include("notifications.urls")),  # /ses/events (SNS)
    path("admin/", admin.site.urls),
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
]
