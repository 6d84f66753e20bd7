"""Outbox batching and idempotent jobs for Django on django-q2.

The public names are imported lazily so that ``import django_outbox`` works before the
app registry is ready (settings files, ``INSTALLED_APPS``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "BatchResult",
    "JobError",
    "LeaseLost",
    "OutboxError",
    "PayloadError",
    "PermanentFailure",
    "RetryAfter",
    "UniqueJob",
    "UnknownStream",
    "apublish",
    "apublish_many",
    "publish",
    "publish_many",
    "wake",
]

_LAZY = {
    "Batch": "django_outbox.batch",
    "BatchResult": "django_outbox.batch",
    "JobError": "django_outbox.exceptions",
    "LeaseLost": "django_outbox.exceptions",
    "OutboxError": "django_outbox.exceptions",
    "PayloadError": "django_outbox.exceptions",
    "PermanentFailure": "django_outbox.exceptions",
    "RetryAfter": "django_outbox.exceptions",
    "UniqueJob": "django_outbox.models",
    "UnknownStream": "django_outbox.exceptions",
    "apublish": "django_outbox.publishing",
    "apublish_many": "django_outbox.publishing",
    "publish": "django_outbox.publishing",
    "publish_many": "django_outbox.publishing",
    "wake": "django_outbox.runs",
}

if TYPE_CHECKING:
    from django_outbox.batch import Batch, BatchResult
    from django_outbox.exceptions import (
        JobError,
        LeaseLost,
        OutboxError,
        PayloadError,
        PermanentFailure,
        RetryAfter,
        UnknownStream,
    )
    from django_outbox.models import UniqueJob
    from django_outbox.publishing import apublish, apublish_many, publish, publish_many
    from django_outbox.runs import wake


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_outbox' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(module), name)
