"""Vendor-specific SQL, behind one interface chosen by ``connection.vendor``.

Nothing outside this package builds SQL or asks which database it runs on.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model
from django.utils import timezone

from django_outbox.db.base import BufferOps


def connection_for(model: type[Model]) -> BaseDatabaseWrapper:
    """Return the connection that writes *model*'s table."""
    return connections[router.db_for_write(model)]


def buffer_ops(model: type[Model]) -> BufferOps:
    """Return the buffer operations for the database that holds *model*."""
    connection = connection_for(model)
    if connection.vendor == "postgresql":
        from django_outbox.db.postgresql import PostgresBufferOps

        return PostgresBufferOps(connection, model)
    if connection.vendor == "sqlite":
        from django_outbox.db.sqlite import SQLiteBufferOps

        return SQLiteBufferOps(connection, model)
    raise NotImplementedError(
        f"django_outbox supports PostgreSQL and SQLite, not {connection.vendor!r}."
    )


__all__ = ["BufferOps", "buffer_ops", "connection_for", "database_now", "start_attempt"]


def database_now(alias: str = "default") -> datetime:
    """Return the database's current time as an aware UTC datetime."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        from django_outbox.db.postgresql import NOW_SQL
    else:
        from django_outbox.db.sqlite import NOW_SQL
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {NOW_SQL}".replace("%%", "%"))
        value = cursor.fetchone()[0]
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if timezone.is_aware(value) else value.replace(tzinfo=UTC)


def _vendor(connection: BaseDatabaseWrapper):
    if connection.vendor == "postgresql":
        from django_outbox.db import postgresql

        return postgresql
    from django_outbox.db import sqlite

    return sqlite


def start_attempt(
    group_id: uuid.UUID, stream: str, lease_seconds: float, worker: str
) -> int | None:
    """Move a queued group to running with the next attempt number, in one statement.

    Returns the new attempt number, or ``None`` when the group is not queued (running
    elsewhere, finished, or gone): the caller has nothing to do.
    """
    from django_outbox.models import GroupState, OutboxGroup

    connection = connection_for(OutboxGroup)
    vendor = _vendor(connection)
    expiry, expiry_params = vendor.seconds_from_now(lease_seconds)
    table = connection.ops.quote_name(OutboxGroup._meta.db_table)
    pk = OutboxGroup._meta.pk.get_db_prep_value(group_id, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET state = %s, attempt = attempt + 1, "
            f"lease_expires_at = {expiry}, worker = %s, updated_at = {vendor.NOW_SQL} "
            "WHERE id = %s AND stream = %s AND state = %s RETURNING attempt",
            [GroupState.RUNNING, *expiry_params, worker, pk, stream, GroupState.CLAIMED],
        )
        row = cursor.fetchone()
    return int(row[0]) if row else None
