"""The job options of task records: the kind's defaults, tuned by the backend's OPTIONS.

Every ``TASKS`` alias whose backend is :class:`OutboxTaskBackend` shares one table, so
they share its options: ``OPTIONS`` keys are the upper-case names of the tunable kind
options (``MAX_ATTEMPTS``, ``CONCURRENCY``…), and two aliases may not set one
differently (the backend's system checks say so).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from django_outbox.base.option_table import OptionTable
from django_outbox.unique.options import OPTIONS

#: The kind options a backend's OPTIONS may set (the others define the table).
TUNABLE = OptionTable(
    *(
        OPTIONS.by_name[name]
        for name in (
            "max_attempts",
            "backoff_seconds",
            "backoff_max_seconds",
            "concurrency",
            "chunk_size",
            "jobs_per_statement",
            "lease_seconds",
            "cluster",
            "retention_days",
            "dispatch_every_minutes",
        )
    )
)


#: The kind of our backend's tasks (``OutboxTaskBackend.task_kind``).
TASK_KIND = "django_outbox_tasks.TaskRecord"


def is_ours(params: Any) -> bool:
    """Whether a ``TASKS`` entry uses :class:`OutboxTaskBackend` (or a subclass): a
    backend class that stores its tasks as our task kind."""
    path = params.get("BACKEND") if isinstance(params, dict) else None
    try:
        backend = import_string(path) if isinstance(path, str) else None
    except ImportError:
        return False
    return getattr(backend, "task_kind", None) == TASK_KIND


def our_aliases() -> dict[str, dict[str, Any]]:
    """The ``TASKS`` entries that use our backend, by alias."""
    tasks = getattr(settings, "TASKS", {}) or {}
    return {alias: params for alias, params in tasks.items() if is_ours(params)}


def given(params: dict[str, Any]) -> dict[str, Any]:
    """An entry's OPTIONS by kind option name (lower case); not validated."""
    options = params.get("OPTIONS") or {}
    if not isinstance(options, dict):
        return {}
    return {str(key).lower(): value for key, value in options.items()}


def configured() -> dict[str, Any]:
    """The tunable options set by our aliases (the first alias wins a disagreement, which
    a check reports); the values are validated by the backend's checks."""
    merged: dict[str, Any] = {}
    for params in our_aliases().values():
        for name, value in given(params).items():
            if name in TUNABLE:
                merged.setdefault(name, value)
    return merged
