from __future__ import annotations

from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "django_outbox"
    label = "django_outbox"
    verbose_name = "Outbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_outbox import checks, conf  # noqa: F401  (registers checks and signal handlers)
        from django_outbox.unique import checks as unique_checks  # noqa: F401
