"""Delete what has outlived its retention, in bounded batches.

Targets: expired idempotency keys; archived rows per stream and outcome (``done`` after
``ARCHIVE_RETENTION_DAYS``, dead letters after ``ARCHIVE_FAILED_RETENTION_DAYS``, both
overridable per stream); finished unique jobs per kind after its ``retention_days``.
Each batch is one short transaction that deletes at most ``batch_size`` rows found by an
index, so pruning millions of rows never holds a long transaction or lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import models, transaction

from django_outbox.conf import outbox_settings
from django_outbox.db import connection_for, database_now
from django_outbox.db import idempotency as keys_sql
from django_outbox.models import ArchivedEvent, IdempotencyKey, Outcome
from django_outbox.models.unique import UniqueJob, all_kinds
from django_outbox.unique.options import kind_options

DEFAULT_BATCH_SIZE = 5000


@dataclass(frozen=True)
class PruneTarget:
    """Rows of one table that are due: a label, and how to select them at time *now*."""

    label: str
    model: type[models.Model]
    due: Callable[[datetime], models.QuerySet]


def _finished_jobs(kind: type[UniqueJob]) -> Callable[[datetime], models.QuerySet]:
    """The due rows of a job kind: its finished jobs past retention, whatever *now*."""
    return lambda now: kind.prunable()


@dataclass
class PruneResult:
    target: str
    rows: int
    seconds: float
    dry_run: bool


def prune_targets(streams: list[str] | None = None) -> list[PruneTarget]:
    """Every target, or only the archive of *streams* when given."""
    config = outbox_settings()
    targets: list[PruneTarget] = []
    if streams is None:
        targets.append(
            PruneTarget(
                "idempotency keys (expired)",
                IdempotencyKey,
                lambda now: IdempotencyKey.objects.filter(expires_at__lte=now),
            )
        )
    archived = streams if streams is not None else _archived_streams()
    for stream in archived:
        for outcome in (Outcome.DONE, Outcome.FAILED):
            days = config.retention_days(stream, outcome)
            targets.append(
                PruneTarget(
                    f"archive {stream} {outcome} (older than {days} days)",
                    ArchivedEvent,
                    _archive_due(stream, outcome, days),
                )
            )
    if streams is None:
        for kind in all_kinds():
            days = kind_options(kind).retention_days
            targets.append(
                PruneTarget(
                    f"unique jobs {kind._meta.label} (finished, older than {days} days)",
                    kind,
                    _finished_jobs(kind),
                )
            )
    return targets


def _archive_due(stream: str, outcome: str, days: int) -> Callable[[datetime], models.QuerySet]:
    def due(now: datetime) -> models.QuerySet:
        return ArchivedEvent.objects.filter(
            stream=stream, outcome=outcome, archived_at__lt=now - timedelta(days=days)
        )

    return due


def _archived_streams() -> list[str]:
    """Configured streams, and streams that only the archive still remembers."""
    configured = list(outbox_settings().streams)
    # A loose index scan would be cheaper on a huge archive; DISTINCT on the leading
    # column of the (stream, outcome, archived_at) index is bounded by that index.
    seen = ArchivedEvent.objects.values_list("stream", flat=True).order_by("stream").distinct()
    return configured + sorted(set(seen) - set(configured))


def prune_all(
    *,
    dry_run: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    streams: list[str] | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> list[PruneResult]:
    """Prune every target; with *dry_run*, count what would go and delete nothing."""
    results = []
    for target in prune_targets(streams):
        started = time.perf_counter()
        if dry_run:
            now = database_now(connection_for(target.model).alias)
            rows = target.due(now).count()
        else:
            rows = _delete_in_batches(target, batch_size, progress)
        results.append(PruneResult(target.label, rows, time.perf_counter() - started, dry_run))
    return results


def _delete_in_batches(
    target: PruneTarget, batch_size: int, progress: Callable[[str, int], None] | None
) -> int:
    alias = connection_for(target.model).alias
    deleted = 0
    while True:
        with transaction.atomic(using=alias):
            if target.model is IdempotencyKey:
                count = keys_sql.delete_expired_batch(batch_size)
            else:
                now = database_now(alias)
                ids = list(target.due(now).values_list("pk", flat=True)[:batch_size])
                count = target.model._base_manager.filter(pk__in=ids).delete()[0] if ids else 0
        deleted += count
        if progress is not None:
            progress(target.label, deleted)
        if count < batch_size:
            return deleted
