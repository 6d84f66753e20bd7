"""The no-op tasks of the django.tasks benchmark: one per backend (Django 6.0+)."""

from __future__ import annotations

from django.tasks import task


@task
def outbox_noop(number: int) -> None:
    """A task of django_outbox's backend (the "default" alias): nothing to do."""


@task(backend="db")
def db_noop(number: int) -> None:
    """The same for django-tasks-db's backend (the "db" alias)."""
