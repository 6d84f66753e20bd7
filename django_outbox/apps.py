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
        from django.db.models.signals import post_migrate

        from django_outbox import checks, conf, runs  # noqa: F401
        from django_outbox.unique import checks as unique_checks  # noqa: F401

        # A state row per configured stream, so the admin lists every stream to pause.
        post_migrate.connect(
            _create_state_rows, sender=self, dispatch_uid="django_outbox.create_state_rows"
        )

        if apps.is_installed("django.contrib.admin"):
            # After the admin's autodiscover (when "django.contrib.admin" is listed first,
            # as usual): buffer models the project did not register get our admin.
            from django_outbox.admin import register_stream_buffers

            register_stream_buffers()


def _create_state_rows(sender: AppConfig, using: str = "default", **kwargs: object) -> None:
    from django.db import connections, router

    from django_outbox.models import StreamState
    from django_outbox.runs import create_state_rows

    if not router.allow_migrate_model(using, StreamState):
        return
    with connections[using].cursor() as cursor:  # not there after migrating to zero
        if StreamState._meta.db_table in connections[using].introspection.table_names(cursor):
            create_state_rows(using)
