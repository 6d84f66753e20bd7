from __future__ import annotations

from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "django_outbox"
    label = "django_outbox"
    verbose_name = "Outbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.apps import apps

        # Registers the checks, the settings-cache reset and the run loop's wake receivers.
        from django_outbox import checks, conf, runs  # noqa: F401
        from django_outbox.unique import checks as unique_checks  # noqa: F401

        if apps.is_installed("django.contrib.admin"):
            # After the admin's autodiscover (when "django.contrib.admin" is listed first,
            # as usual): buffer models the project did not register get our admin.
            from django_outbox.admin import register_stream_buffers

            register_stream_buffers()
