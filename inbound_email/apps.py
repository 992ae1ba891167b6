from django.apps import AppConfig


class InboundEmailConfig(AppConfig):
    name = "inbound_email"
    verbose_name = "Inbound email"
