from __future__ import annotations

from collections.abc import Callable, Iterator

from django.apps import AppConfig
from django.dispatch import Signal


class OutboxConfig(AppConfig):
    name = "django_outbox"
    label = "django_outbox"
    verbose_name = "Outbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.apps import apps

        # Registers the checks and the settings-cache reset.
        from django.db.models.signals import post_migrate

        from django_outbox import checks, conf  # noqa: F401
        from django_outbox.unique import checks as unique_checks  # noqa: F401

        _connect_wake_receivers()

        # A state row per configured stream, so the admin lists every stream to pause.
        post_migrate.connect(
            _create_state_rows, sender=self, dispatch_uid="django_outbox.create_state_rows"
        )
        # The claim floor's trigger on each stream's own buffer table (PostgreSQL).
        post_migrate.connect(
            _install_floor_triggers, sender=self, dispatch_uid="django_outbox.floor_triggers"
        )

        if apps.is_installed("django.contrib.admin"):
            # After the admin's autodiscover (when "django.contrib.admin" is listed first,
            # as usual): buffer models the project did not register get our admin.
            from django_outbox.admin import register_stream_buffers

            register_stream_buffers()


def _wake_receivers() -> Iterator[tuple[Signal, Callable[..., None], type, str]]:
    """``(signal, receiver, sender, dispatch_uid)`` of the wake on every ORM write of a
    buffer model's rows: each buffer model (a proxy too) is a sender of its own, so a
    save of any other model calls nothing of ours."""
    from django.apps import apps
    from django.db.models.signals import post_save

    from django_outbox.models import BufferEvent
    from django_outbox.models.buffer import rows_bulk_created
    from django_outbox.streams.run import _wake_on_bulk_create, _wake_on_save

    for model in apps.get_models():
        if issubclass(model, BufferEvent):
            yield post_save, _wake_on_save, model, "django_outbox.wake_on_save"
            yield (
                rows_bulk_created,
                _wake_on_bulk_create,
                model,
                "django_outbox.wake_on_bulk_create",
            )


def _connect_wake_receivers() -> None:
    for signal, receiver, sender, uid in _wake_receivers():
        signal.connect(receiver, sender=sender, dispatch_uid=uid)


def _create_state_rows(sender: AppConfig, using: str = "default", **kwargs: object) -> None:
    from django.db import connections, router

    from django_outbox.models import StreamState
    from django_outbox.streams.run import create_state_rows

    if not router.allow_migrate_model(using, StreamState):
        return
    with connections[using].cursor() as cursor:  # not there after migrating to zero
        if StreamState._meta.db_table in connections[using].introspection.table_names(cursor):
            create_state_rows(using)


def _install_floor_triggers(sender: AppConfig, using: str = "default", **kwargs: object) -> None:
    from django_outbox.streams.claim_floor import install_triggers

    install_triggers(using)
