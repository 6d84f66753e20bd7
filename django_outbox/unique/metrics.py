"""Bounded counts of unique jobs per kind and state, for the metrics view and the admin."""

from __future__ import annotations

from collections.abc import Iterator

from django_outbox.models.unique import JobState
from django_outbox.unique.options import all_kinds


def unique_job_counts(cap: int) -> Iterator[tuple[str, str, int]]:
    """(kind label, state, count stopping at *cap*) for every kind and state."""
    for kind in all_kinds():
        for state in JobState.values:
            rows = kind._default_manager.filter(state=state).values("id")[:cap]
            yield kind._meta.label, state, rows.count()
