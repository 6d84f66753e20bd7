"""django-q2 task functions: thin wrappers over the core, addressed by dotted path.

They always return normally after recording the outcome in our tables, so django-q2
never redelivers them on its own; our tables decide what runs again.
"""

from __future__ import annotations

from typing import Any

from django_outbox.archive.prune import prune_all
from django_outbox.jobs.staging import (
    GUARD_SCOPE,
    drain_until_empty,
    run_staged_job,
    run_traced_job,
)
from django_outbox.models.unique import get_kind
from django_outbox.streams.distribute import distribute_all, distribute_stream, retry_group
from django_outbox.streams.run import run_stream, run_woken
from django_outbox.unique.dispatch import dispatch, dispatch_all, run_jobs

__all__ = [
    "dispatch_unique",
    "distribute",
    "drain_staged",
    "prune",
    "retry",
    "run",
    "run_staged",
    "run_traced",
    "run_unique_jobs",
    "wake",
]


def distribute(stream: str | None = None) -> list[dict[str, Any]]:
    """Distribute one stream, or every stream when *stream* is None."""
    results = [distribute_stream(stream)] if stream else distribute_all()
    return [vars(result) for result in results]


def run(stream: str, group_id: str | None = None) -> list[str]:
    """Run *stream*'s loop from *group_id*; return the outcome of each group processed."""
    return [outcome.value for outcome in run_stream(stream, group_id)]


def wake(stream: str) -> list[str]:
    """Run *stream* in this worker: the wake a publish queued in its own INSERT."""
    return [outcome.value for outcome in run_woken(stream)]


def retry(stream: str, group_id: str) -> list[str]:
    """Run a group's retry when it fell due, then *stream*'s loop on from it."""
    return [outcome.value for outcome in retry_group(stream, group_id)]


def drain_staged() -> dict[str, Any]:
    """Forward staged jobs until none is due or ``STAGING["DRAIN_SECONDS"]`` ran out."""
    return vars(drain_until_empty())


def run_staged(
    key: str,
    func: str,
    args: list[Any],
    kwargs: dict[str, Any],
    scope: str | None = None,
    staged_id: int | None = None,
    using: str | None = None,
) -> Any:
    """Run a forwarded staged job behind its idempotency guard (*scope*, *staged_id*,
    *using*: see staging)."""
    return run_staged_job(key, func, args, kwargs, scope or GUARD_SCOPE, staged_id, using)


def run_traced(
    traceparent: str, func: str, args: list[Any], kwargs: dict[str, Any] | None = None
) -> Any:
    """Run a forwarded staged job in a span continuing the trace that staged it."""
    return run_traced_job(traceparent, func, args, kwargs or {})


def prune() -> list[dict[str, Any]]:
    """Delete what has outlived its retention (``manage.py outbox_prune``)."""
    return [vars(result) for result in prune_all()]


def dispatch_unique(kind: str | None = None) -> list[dict[str, Any]]:
    """Dispatch one unique-job kind (``app_label.ModelName``), or every kind when None."""

    results = [dispatch(get_kind(kind))] if kind else dispatch_all()
    return [{k: v for k, v in vars(result).items() if k != "kept"} for result in results]


def run_unique_jobs(kind: str, jobs: list[list[int]]) -> list[str]:
    """Run a chunk of *kind*'s jobs, ``[id, attempt]`` pairs, then the kind's next chunks."""
    return [outcome.value for outcome in run_jobs(kind, jobs)]
