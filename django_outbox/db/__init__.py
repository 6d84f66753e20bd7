"""The package's SQL: buffer operations, leases, staged jobs, keys, unique jobs, triggers.

Every statement is built from the connection's :class:`~django_outbox.db.dialect.Dialect`;
nothing outside this package builds SQL or asks which database it runs on.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model
from django.utils import timezone

from django_outbox.db.base import BufferOps
from django_outbox.db.dialect import Dialect, dialect_of
from django_outbox.db.postgresql import PostgresBufferOps
from django_outbox.db.sqlite import SQLiteBufferOps
from django_outbox.models import GroupState, OutboxGroup

if TYPE_CHECKING:
    from django_outbox.conf import StreamConfig


#: The buffer operations of each dialect: they differ in how a group moves to the archive.
BUFFER_OPS: dict[str, type[BufferOps]] = {
    "postgresql": PostgresBufferOps,
    "sqlite": SQLiteBufferOps,
}


def connection_for(model: type[Model]) -> BaseDatabaseWrapper:
    """Return the connection that writes *model*'s table."""
    return connections[router.db_for_write(model)]


def dialect_for(model: type[Model]) -> Dialect:
    """The dialect of the database that holds *model*."""
    return dialect_of(connection_for(model))


def buffer_ops(model: type[Model], stream: str | None = None) -> BufferOps:
    """The buffer operations over *model*'s table; *stream* filters the shared buffer."""
    connection = connection_for(model)
    ops_class = BUFFER_OPS[dialect_of(connection).vendor]
    return ops_class(connection, model, stream)


def stream_buffer(config: StreamConfig) -> BufferOps:
    """The buffer operations of a stream: its model, filtered to it in the shared buffer."""
    return buffer_ops(config.model_class, config.name if config.is_generic else None)


__all__ = [
    "BufferOps",
    "Dialect",
    "buffer_ops",
    "connection_for",
    "database_now",
    "dialect_for",
    "dialect_of",
    "start_attempt",
    "stream_buffer",
]


def database_now(alias: str = "default") -> datetime:
    """Return the database's current time as an aware UTC datetime."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {dialect_of(connection).now}".replace("%%", "%"))
        value = cursor.fetchone()[0]
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if timezone.is_aware(value) else value.replace(tzinfo=UTC)


def start_attempt(
    group_id: uuid.UUID, stream: str, lease_seconds: float, worker: str
) -> int | None:
    """Move a queued group to running with the next attempt number, in one statement.

    Returns the new attempt number, or ``None`` when the group is not queued (running
    elsewhere, finished, or gone): the caller has nothing to do.
    """

    connection = connection_for(OutboxGroup)
    dialect = dialect_of(connection)
    expiry, expiry_params = dialect.seconds_from_now(lease_seconds)
    table = connection.ops.quote_name(OutboxGroup._meta.db_table)
    pk = OutboxGroup._meta.pk.get_db_prep_value(group_id, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET state = %s, attempt = attempt + 1, "
            f"lease_expires_at = {expiry}, worker = %s, updated_at = {dialect.now} "
            "WHERE id = %s AND stream = %s AND state = %s RETURNING attempt",
            [GroupState.RUNNING, *expiry_params, worker, pk, stream, GroupState.CLAIMED],
        )
        row = cursor.fetchone()
    return int(row[0]) if row else None
