"""The project's own app configs."""

from django.contrib.admin.apps import AdminConfig


class WorkerAdminConfig(AdminConfig):
    """django.contrib.admin, with `admin.site` being project.admin_site.WorkerAdminSite."""

    default_site = "project.admin_site.WorkerAdminSite"
