"""A ``django.tasks`` backend (Django 6.0+) that runs tasks with django_outbox's job engine.

Settings::

    INSTALLED_APPS = [..., "django_q", "django_outbox", "django_outbox.tasks_backend"]
    TASKS = {"default": {"BACKEND": "django_outbox.tasks_backend.OutboxTaskBackend"}}

``task.enqueue()`` inserts a :class:`~django_outbox.tasks_backend.models.TaskRecord` row
in the caller's transaction (on the database the router picks for that table), and the
commit hands it to django-q2 workers in chunks, with leases, retries and results kept in
the row. See the README, "django.tasks backend".
"""

from __future__ import annotations

import django

if django.VERSION < (6, 0):
    raise ImportError(
        "django_outbox.tasks_backend needs Django 6.0 or later (django.tasks); this is "
        f"Django {django.get_version()}. Remove it from INSTALLED_APPS and TASKS, or "
        "upgrade Django. The rest of django_outbox works without it."
    )

from django_outbox.tasks_backend.backend import OutboxTask, OutboxTaskBackend  # noqa: E402, RUF100

__all__ = ["OutboxTask", "OutboxTaskBackend"]
