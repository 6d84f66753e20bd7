from __future__ import annotations

from django.apps import AppConfig


class TasksBackendConfig(AppConfig):
    name = "django_outbox.tasks_backend"
    label = "django_outbox_tasks"
    verbose_name = "Outbox tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the cache reset of the task kind's options on a change of TASKS.
        from django_outbox.tasks_backend import options  # noqa: F401
