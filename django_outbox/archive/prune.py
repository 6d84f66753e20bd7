"""Delete what has outlived its retention, in bounded batches.

Targets: expired idempotency keys; archived rows per stream and outcome (``done`` after
``ARCHIVE_RETENTION_DAYS``, dead letters after ``ARCHIVE_FAILED_RETENTION_DAYS``, both
overridable per stream); finished unique jobs per kind after its ``retention_days``.
Each batch is one short transaction that deletes at most ``batch_size`` rows found by an
index, so pruning millions of rows never holds a long transaction or lock.

A partitioned archive (PostgreSQL, :mod:`django_outbox.archive.partitions`) retires whole
partitions instead: each outcome's partitions that lie entirely before the longest
retention of that outcome are dropped, and only streams with a shorter retention of
their own, and the rows of the legacy partition, are still deleted row by row.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import models, router, transaction

from django_outbox.archive import partitions
from django_outbox.base.dialect import database_now
from django_outbox.base.routing import connection_for, on_database
from django_outbox.conf import outbox_settings
from django_outbox.jobs.sql import idempotency as keys_sql
from django_outbox.models.archive import ArchivedEvent, Outcome
from django_outbox.models.keys import IdempotencyKey
from django_outbox.models.unique import UniqueJob, all_kinds
from django_outbox.unique.options import kind_options

DEFAULT_BATCH_SIZE = 5000


@dataclass(frozen=True)
class PruneTarget:
    """Rows of one table that are due: a label, and how to select them at time *now*."""

    label: str
    model: type[models.Model]
    due: Callable[[datetime], models.QuerySet]
    #: Conditions that confine the delete by id to the partitions that can hold the rows
    #: (a partitioned archive: its primary key is ``(id, outcome, archived_at)``).
    confine: Callable[[datetime], dict[str, object]] | None = None
    #: The database of the rows (an archive's: its stream's); None: where the router says.
    alias: str | None = None


def _finished_jobs(kind: type[UniqueJob]) -> Callable[[datetime], models.QuerySet]:
    """The due rows of a job kind: its finished jobs past retention, whatever *now*."""
    return lambda now: kind.prunable()


@dataclass
class PruneResult:
    target: str
    rows: int
    seconds: float
    dry_run: bool


def prune_targets(
    streams: list[str] | None = None, known: list[str] | None = None
) -> list[PruneTarget]:
    """Every target, or only the archive of *streams* when given (*known*: the streams
    of :func:`_archived_streams`, when the caller has read them already)."""
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
    archived = streams if streams is not None else known or _archived_streams()
    by_database = _by_database(archived)
    partitioning = {}
    for alias in by_database:  # each stream database's archive, partitioned or not
        with on_database(alias):
            partitioning[alias] = partitions.archive_partitioning()
    for stream in archived:
        alias = _stream_alias(stream)
        partitioned, neighbours = partitioning[alias], by_database[alias]
        for outcome in (Outcome.DONE, Outcome.FAILED):
            days = config.retention_days(stream, outcome)
            longest = max((config.retention_days(s, outcome) for s in neighbours), default=days)
            before = None
            if partitioned is not None and days >= longest and streams is None:
                # Retired with whole partitions; only the legacy partition holds rows
                # that must still go one by one.
                legacy = [p for p in partitioned.partitions if p.outcome == outcome and p.is_legacy]
                if not legacy:
                    continue
                before = legacy[0].upper
            targets.append(
                PruneTarget(
                    f"archive {stream} {outcome} (older than {days} days)",
                    ArchivedEvent,
                    _archive_due(stream, outcome, days, before),
                    None if partitioned is None else _confine(outcome, days, before),
                    _stream_alias(stream),
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


def _stream_alias(stream: str) -> str:
    """The database of a stream's archive: a configured stream's own; the router's for
    one only the archive remembers."""
    config = outbox_settings().streams.get(stream)
    return config.alias if config is not None else router.db_for_write(ArchivedEvent)


def _by_database(streams: list[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for stream in streams:
        found.setdefault(_stream_alias(stream), []).append(stream)
    return found


def _archive_due(
    stream: str, outcome: str, days: int, before: datetime | None = None
) -> Callable[[datetime], models.QuerySet]:
    """The archived rows of *stream* and *outcome* past retention (and before *before*)."""

    def due(now: datetime) -> models.QuerySet:
        cutoff = now - timedelta(days=days)
        return ArchivedEvent.objects.filter(
            stream=stream,
            outcome=outcome,
            archived_at__lt=cutoff if before is None else min(cutoff, before),
        )

    return due


def _confine(
    outcome: str, days: int, before: datetime | None
) -> Callable[[datetime], dict[str, object]]:
    def confine(now: datetime) -> dict[str, object]:
        cutoff = now - timedelta(days=days)
        return {
            "outcome": outcome,
            "archived_at__lt": cutoff if before is None else min(cutoff, before),
        }

    return confine


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
    """Prune every target; with *dry_run*, count what would go and delete nothing.

    On a partitioned archive (and without *streams*), partitions are created ahead and
    those entirely past retention dropped first; their rows are the planner's estimate.
    """
    results = []
    known = None
    if streams is None:
        known = _archived_streams()
        for alias, names in _by_database(known).items():
            with on_database(alias):
                results.extend(_retire_partitions(names, dry_run))
    for target in prune_targets(streams, known):
        started = time.perf_counter()
        with on_database(target.alias):
            if dry_run:
                now = database_now(connection_for(target.model).alias)
                rows = target.due(now).count()
            else:
                rows = _delete_in_batches(target, batch_size, progress)
        results.append(PruneResult(target.label, rows, time.perf_counter() - started, dry_run))
    return results


def _retire_partitions(streams: list[str], dry_run: bool) -> list[PruneResult]:
    started = time.perf_counter()
    maintenance = partitions.maintain_archive(streams, dry_run=dry_run)
    results = []
    for outcome in (Outcome.DONE, Outcome.FAILED):
        dropped = [p for p in maintenance.dropped if p.outcome == outcome]
        if dropped:
            rows = sum(maintenance.rows[p.name] for p in dropped)
            label = f"archive partitions {outcome} ({len(dropped)} past retention, rows estimated)"
            results.append(PruneResult(label, rows, time.perf_counter() - started, dry_run))
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
                rows = target.model._base_manager.db_manager(alias).filter(pk__in=ids)
                if target.confine is not None:
                    rows = rows.filter(**target.confine(now))
                count = rows.delete()[0] if ids else 0
        deleted += count
        if progress is not None:
            progress(target.label, deleted)
        if count < batch_size:
            return deleted
