"""Keep a partitioned archive's partitions: create them ahead, retire the old ones whole.

The archive is partitioned by the migration operation
:class:`~django_outbox.operations.PartitionArchive` (PostgreSQL). From then on the
prune schedule calls :func:`maintain_archive`: it creates the partitions of both
outcomes from now until two prune periods and one interval ahead, and drops each partition that lies
entirely before its outcome's retention, in O(1) instead of deleting row by row.
A partition that straddles the cutoff is kept whole until it is entirely older, so
rows live up to one interval beyond their retention.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction

from django_outbox.archive.sql import partitions as sql
from django_outbox.base.dialect import database_now
from django_outbox.base.routing import connection_for
from django_outbox.conf import outbox_settings
from django_outbox.models.archive import ArchivedEvent

__all__ = [
    "ArchivePartitioning",
    "archive_partitioning",
    "maintain_archive",
]


@dataclass(frozen=True)
class ArchivePartitioning:
    """The archive's partitioning as the database records it."""

    table: str
    interval: timedelta
    partitions: list[sql.Partition]

    def covering(self, outcome: str, moment: datetime) -> sql.Partition | None:
        """The partition of *outcome* whose range holds *moment*."""
        for partition in self.partitions:
            if (
                partition.outcome == outcome
                and (partition.lower is None or partition.lower <= moment)
                and moment < partition.upper
            ):
                return partition
        return None


def archive_partitioning() -> ArchivePartitioning | None:
    """The archive's partitioning; None when its table is not partitioned (or on SQLite).

    Raises ValueError when the table is partitioned but records no valid interval.
    """
    connection = connection_for(ArchivedEvent)
    table = ArchivedEvent._meta.db_table
    recorded = sql.recorded_interval(connection, table)
    if recorded is None:
        return None
    return ArchivePartitioning(
        table, sql.parse_interval(recorded), sql.partitions(connection, table)
    )


@dataclass
class Maintenance:
    created: list[str] = field(default_factory=list)
    dropped: list[sql.Partition] = field(default_factory=list)
    #: The planner's estimate of each dropped partition's rows, by name.
    rows: dict[str, int] = field(default_factory=dict)


def retention_cutoffs(streams: list[str], now: datetime) -> dict[str, datetime]:
    """Per outcome, the time before which every stream's rows have outlived retention."""
    config = outbox_settings()
    return {
        outcome: now
        - timedelta(days=max(config.retention_days(s, outcome) for s in streams or [""]))
        for outcome in sql.OUTCOMES
    }


def ensure_partitions(now: datetime | None = None) -> list[str]:
    """Create the archive's missing partitions from now to :func:`horizon`; their names."""
    connection = connection_for(ArchivedEvent)
    with transaction.atomic(using=connection.alias):
        sql.lock_maintenance(connection)
        state = archive_partitioning()
        if state is None:
            return []
        now = now or database_now(connection.alias)
        names, statements = sql.ensure_statements(
            connection,
            state.table,
            state.interval,
            now,
            now + sql.horizon(state.interval, outbox_settings().prune_every_minutes),
            state.partitions,
        )
        sql.execute(connection, statements)
    return names


def due_partitions(state: ArchivePartitioning, cutoffs: dict[str, datetime]) -> list[sql.Partition]:
    """The partitions that lie entirely before their outcome's cutoff."""
    return [p for p in state.partitions if p.upper <= cutoffs[p.outcome]]


def maintain_archive(streams: list[str], *, dry_run: bool = False) -> Maintenance:
    """Create partitions ahead and drop those entirely past retention for every stream."""
    done = Maintenance()
    state = archive_partitioning()
    if state is None:
        return done
    connection = connection_for(ArchivedEvent)
    now = database_now(connection.alias)
    due = due_partitions(state, retention_cutoffs(streams, now))
    done.rows = {partition.name: rows_estimate(partition) for partition in due}
    if dry_run:
        done.dropped = due
        return done
    done.created = ensure_partitions(now)
    for partition in due:
        statements = sql.detach_statements(connection, state.table, partition)
        if connection.in_atomic_block:
            # DETACH CONCURRENTLY cannot run in a transaction: the plain form locks the
            # outcome's subtree for the (short) detach instead.
            statements[0] = statements[0].replace(" CONCURRENTLY", "")
        sql.execute(connection, statements)
        done.dropped.append(partition)
    return done


def rows_estimate(partition: sql.Partition) -> int:
    """The rows of *partition* as the planner estimates them (no scan), 0 when unknown."""
    connection = connection_for(ArchivedEvent)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = to_regclass(%s)",
            [connection.ops.quote_name(partition.name)],
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0
