from django.apps import AppConfig


class CanonicalIdsConfig(AppConfig):
    name = "canonical_ids"
    verbose_name = "Canonical ids"
