"""Without django.tasks (Django 5.2) the backend is unavailable, and says so."""

from __future__ import annotations

import importlib
import sys

import django
import pytest


@pytest.mark.skipif(django.VERSION >= (6, 0), reason="Django 6.0+ has django.tasks")
def test_the_backend_explains_that_it_needs_django_6():
    sys.modules.pop("django_outbox.tasks_backend", None)
    with pytest.raises(ImportError, match=r"needs Django 6\.0 or later \(django\.tasks\)"):
        importlib.import_module("django_outbox.tasks_backend")


@pytest.mark.skipif(django.VERSION < (6, 0), reason="django.tasks exists from Django 6.0 on")
def test_the_backend_imports_on_django_6():
    from django_outbox.tasks_backend import OutboxTaskBackend

    assert OutboxTaskBackend.supports_get_result
