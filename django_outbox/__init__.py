"""Outbox batching and idempotent jobs for Django on django-q2.

The public names are imported lazily so that ``import django_outbox`` works before the
app registry is ready (settings files, ``INSTALLED_APPS``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "BatchResult",
    "Guard",
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
    "astage_task",
    "current_traceparent",
    "dead_letters",
    "idempotent",
    "lock_rows",
    "publish",
    "publish_many",
    "release_keys",
    "replay_failed",
    "retry_on_conflict",
    "run_inline",
    "set_paused",
    "stage_task",
    "wake",
]

_LAZY = {
    "Batch": "django_outbox.streams.batch",
    "BatchResult": "django_outbox.streams.batch",
    "Guard": "django_outbox.jobs.idempotency",
    "JobError": "django_outbox.exceptions",
    "LeaseLost": "django_outbox.exceptions",
    "OutboxError": "django_outbox.exceptions",
    "PayloadError": "django_outbox.exceptions",
    "PermanentFailure": "django_outbox.exceptions",
    "RetryAfter": "django_outbox.exceptions",
    "UniqueJob": "django_outbox.models",
    "UnknownStream": "django_outbox.exceptions",
    "apublish": "django_outbox.streams.publish",
    "apublish_many": "django_outbox.streams.publish",
    "astage_task": "django_outbox.jobs.staging",
    "current_traceparent": "django_outbox.base.tracing",
    "dead_letters": "django_outbox.archive.replay",
    "idempotent": "django_outbox.jobs.idempotency",
    "lock_rows": "django_outbox.jobs.locking",
    "publish": "django_outbox.streams.publish",
    "publish_many": "django_outbox.streams.publish",
    "release_keys": "django_outbox.streams.steer",
    "replay_failed": "django_outbox.archive.replay",
    "retry_on_conflict": "django_outbox.jobs.locking",
    "run_inline": "django_outbox.streams.inline",
    "set_paused": "django_outbox.streams.steer",
    "stage_task": "django_outbox.jobs.staging",
    "wake": "django_outbox.streams.run",
}

if TYPE_CHECKING:
    from django_outbox.archive.replay import dead_letters, replay_failed
    from django_outbox.base.tracing import current_traceparent
    from django_outbox.exceptions import (
        JobError,
        LeaseLost,
        OutboxError,
        PayloadError,
        PermanentFailure,
        RetryAfter,
        UnknownStream,
    )
    from django_outbox.jobs.idempotency import Guard, idempotent
    from django_outbox.jobs.locking import lock_rows, retry_on_conflict
    from django_outbox.jobs.staging import astage_task, stage_task
    from django_outbox.models import UniqueJob
    from django_outbox.streams.batch import Batch, BatchResult
    from django_outbox.streams.inline import run_inline
    from django_outbox.streams.publish import apublish, apublish_many, publish, publish_many
    from django_outbox.streams.run import wake
    from django_outbox.streams.steer import release_keys, set_paused


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_outbox' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(module), name)


class _MovedModules:
    """Finds a module at the path it had before this release's layout
    (:mod:`django_outbox.base.moved`); first on ``sys.meta_path`` so that an old path is
    the moved module itself, never a second copy of it."""

    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith("django_outbox.") or fullname.startswith("django_outbox.base"):
            return None
        from django_outbox.base import moved

        return moved.spec(fullname)


if not any(type(finder).__name__ == "_MovedModules" for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())
