"""Vendor-specific SQL, behind one interface chosen by ``connection.vendor``.

Nothing outside this package builds SQL or asks which database it runs on.
"""

from __future__ import annotations

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


__all__ = ["BufferOps", "buffer_ops", "connection_for", "database_now"]


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
