"""The SQL of streams: the buffer operations of each database, picked per connection.

Every statement is built from the connection's :class:`~django_outbox.base.dialect.Dialect`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import connections
from django.db.models import Model

from django_outbox.base.dialect import Dialect, dialect_of
from django_outbox.base.routing import connection_for
from django_outbox.streams.sql.base import BufferOps
from django_outbox.streams.sql.ordered import OrderedSQL
from django_outbox.streams.sql.postgresql import PostgresBufferOps
from django_outbox.streams.sql.sqlite import SQLiteBufferOps

if TYPE_CHECKING:
    from django_outbox.conf import StreamConfig


#: The buffer operations of each dialect: they differ in how a group moves to the archive.
BUFFER_OPS: dict[str, type[BufferOps]] = {
    "postgresql": PostgresBufferOps,
    "sqlite": SQLiteBufferOps,
}


def buffer_ops(
    model: type[Model], stream: str | None = None, *, alias: str | None = None
) -> BufferOps:
    """The buffer operations over *model*'s table (on *alias*, else where
    :func:`connection_for` says); *stream* filters the shared buffer."""
    connection = connections[alias] if alias is not None else connection_for(model)
    ops_class = BUFFER_OPS[dialect_of(connection).vendor]
    return ops_class(connection, model, stream)


#: The generic buffer's column of an ordered stream's key (``OutboxEvent.order_key``).
GENERIC_ORDER_COLUMN = "order_key"


def stream_buffer(config: StreamConfig) -> BufferOps:
    """The buffer operations of a stream: its model, filtered to it in the shared buffer;
    its claims take nothing while it is paused; an ordered stream's claim keeps each
    key's rows in order (:mod:`django_outbox.streams.sql.ordered`)."""
    ops = buffer_ops(
        config.model_class, config.name if config.is_generic else None, alias=config.alias
    )
    ops.paused_by = config.name  # a claim takes nothing while the stream is paused
    ops.floor_stream = config.name
    if config.order_key is not None:
        # The generic buffer keeps the value of the payload key ORDER_KEY names in a
        # column of its own.
        key = GENERIC_ORDER_COLUMN if config.is_generic else config.order_key
        ops.ordered = OrderedSQL(ops, config.name, key)
    return ops


__all__ = [
    "BufferOps",
    "Dialect",
    "buffer_ops",
    "connection_for",
    "database_now",
    "dialect_for",
    "dialect_of",
    "stream_buffer",
]
