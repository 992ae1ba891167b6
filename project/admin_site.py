"""The admin site: Django's, with the Worker health page listed in the Operations section.

The index used to draw its own "Operations" box for the health link above the app list, which
already had an "Operations" section (the ops app's models): two sections of one name, and a
table of its own that wrapped "Worker health" one letter per line on a phone (issue 31.6).
The link is now the first row of the ops app's section, listed first, on the index, the
app's page and the navigation side bar alike; staff who may see no ops model still get the
section with the link (the page is for all staff).

Its title is the project's, not Django's "Django administration" (issue 36.8): the header of
every page, the login page's included, and the browser tab's title.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse

HEALTH_APP = "ops"
SITE_NAME = "Proposal-assistant worker"  # README's title


class WorkerAdminSite(admin.AdminSite):
    site_header = SITE_NAME  # the bar at the top of every page
    site_title = SITE_NAME  # the end of every browser tab's title
    index_title = "Operator console"  # the index's heading, and its tab's title

    def get_app_list(self, request: HttpRequest, app_label: str | None = None) -> list[dict]:
        app_list = super().get_app_list(request, app_label)
        if app_label not in (None, HEALTH_APP) or not request.user.is_staff:
            return app_list
        app = next((a for a in app_list if a["app_label"] == HEALTH_APP), None)
        if app is None:
            app = _ops_app(self.name)
        else:
            app_list.remove(app)
        app["models"].insert(0, _health_row())
        return [app, *app_list]  # first: where an operator starts


def _ops_app(site_name: str) -> dict[str, Any]:
    config = apps.get_app_config(HEALTH_APP)
    return {
        "name": config.verbose_name,
        "app_label": HEALTH_APP,
        "app_url": reverse(
            "admin:app_list", kwargs={"app_label": HEALTH_APP}, current_app=site_name
        ),
        "has_module_perms": True,
        "models": [],
    }


def _health_row() -> dict[str, Any]:
    """A row as Django's app list draws a model: a name linking the page, "View" beside it."""
    return {
        "model": None,
        "name": "Worker health",
        "object_name": "WorkerHealth",
        "perms": {"add": False, "change": False, "delete": False, "view": True},
        "admin_url": reverse("ops:worker_health"),
        "add_url": None,
        "view_only": True,
    }
