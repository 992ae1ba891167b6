"""The notifications app's endpoints (outside the admin)."""

from django.urls import path

from notifications import views

app_name = "notifications"

urlpatterns = [
    path("ses/events", views.ses_events_view, name="ses_events"),
    path("unsubscribe/<str:token>", views.unsubscribe_view, name="unsubscribe"),
]
