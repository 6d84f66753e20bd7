"""Publish events to the generic buffer, inside the caller's transaction.

``publish()`` is on the hot path of the application's own transactions, so it costs one
INSERT and nothing else: the payload is checked and serialized once, and the row is
written with a single vendor statement instead of a model save (no model signals are
sent for ``OutboxEvent``). On PostgreSQL the same statement also wakes the stream: a run
in flight takes the row, or (with django-q2's ORM broker on the stream's database) it
queues the stream's wake for a worker, committed with the row; either way the commit
needs no wake of its own (:mod:`django_outbox.streams.sql.wake_guard`).

``apublish()`` and ``apublish_many()`` are the same for async code: they run the sync
functions in the thread Django's ORM uses for the caller's thread-sensitive work, so
they join whatever that thread's connection is doing.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections
from django.db.models import JSONField, Value

from django_outbox.base.jsondata import MAX_DEPTH, dumps_or, storable_text
from django_outbox.base.routing import on_database
from django_outbox.base.tracing import current_traceparent
from django_outbox.conf import StreamConfig, get_stream, on_stream_database
from django_outbox.exceptions import PayloadError, WrongBufferModel
from django_outbox.models.buffer import MAX_ORDER_KEY_LENGTH, OutboxEvent
from django_outbox.streams.run import guard_asked, wake, wake_guarded
from django_outbox.streams.sql import buffer_ops
from django_outbox.streams.sql.base import BufferOps

__all__ = [
    "apublish",
    "apublish_many",
    "publish",
    "publish_many",
]

_JSON_NULL = Value(None, output_field=JSONField())
#: The payload's encoder (``DjangoJSONEncoder``): one definition, on the field.
_ENCODER = OutboxEvent._meta.get_field("payload").encoder


def _check(stream: str) -> StreamConfig:
    config = get_stream(stream)
    if not config.is_generic:
        raise WrongBufferModel(
            f"Stream {stream!r} buffers into {config.model}; create {config.model} rows "
            "instead of calling publish()."
        )
    return config


def _dumps(stream: str, payload: Any) -> str:
    return dumps_or(
        lambda exc: PayloadError(
            f"The payload for stream {stream!r} is not JSON that can be stored: {exc}. Pass "
            "dicts, lists, strings, numbers, booleans and None, and what Django's "
            "DjangoJSONEncoder writes as strings (datetimes, dates, times, timedeltas, "
            "Decimals, UUIDs, lazy strings); no NaN or infinity, no NUL characters, "
            f"nested at most {MAX_DEPTH} levels."
        ),
        payload,
        cls=_ENCODER,
    )


def _order_key(config: StreamConfig, payload: Any) -> str | None:
    """The ordered stream's key of *payload*: the value of the top-level payload key its
    ``ORDER_KEY`` names, as text; None (not ordered) when the stream has no
    ``ORDER_KEY`` or the payload no such key (or null).

    A string, an integer or a UUID; anything else is a :class:`PayloadError`, as is a key
    longer than ``MAX_ORDER_KEY_LENGTH``. ``7`` and ``"7"`` are the same key.
    """
    if config.order_key is None or not isinstance(payload, dict):
        return None
    value = payload.get(config.order_key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, uuid.UUID)):
        raise PayloadError(
            f"The payload for stream {config.name!r} has {config.order_key!r} = {value!r}, "
            "which cannot order it: its ORDER_KEY takes a string, an integer or a UUID "
            "(or null, for a row that is not ordered)."
        )
    key = str(value)
    if len(key) > MAX_ORDER_KEY_LENGTH or not storable_text(key):
        raise PayloadError(
            f"The payload for stream {config.name!r} has a {config.order_key!r} that cannot "
            f"be stored as its key: at most {MAX_ORDER_KEY_LENGTH} characters, no NUL."
        )
    return key


def publish(stream: str, payload: Any) -> int:
    """Insert one event for *stream* and return its id.

    The event becomes visible to workers when the surrounding transaction commits, and
    disappears with it if it rolls back. The commit wakes the stream's run loop (see
    :func:`django_outbox.streams.run.wake`). With OpenTelemetry, the row records the recording
    span's ``traceparent`` (:mod:`django_outbox.base.tracing`).

    *payload* is JSON: dicts, lists, strings, numbers, booleans and None, plus what
    Django's ``DjangoJSONEncoder`` encodes (``datetime``, ``date``, ``time``,
    ``timedelta``, ``Decimal``, ``UUID``, lazy strings). Those are stored as the strings
    that encoder writes, and the handler reads them back as strings. Anything else (and
    NaN, infinity, NUL characters, nesting deeper than 100 levels) raises
    :class:`~django_outbox.exceptions.PayloadError` at the call, and nothing is written.

    On an ordered stream (``ORDER_KEY``), the value of the top-level payload key it
    names is the row's key, written in the same INSERT (:func:`_order_key`).
    """
    config = _check(stream)
    payload_json = _dumps(stream, payload)
    key = _order_key(config, payload)
    trace_context = current_traceparent()
    alias = config.alias
    ops = _generic_ops(alias)
    if not ops.wake_guarded:
        event_id = ops.insert_event(stream, payload_json, trace_context, key)
        wake(stream, using=alias)
        return event_id
    if guard_asked(stream, ops.connection):
        # The transaction's first write of the stream asked the guard: its answer covers
        # this row too (:mod:`django_outbox.streams.sql.wake_guard`).
        return ops.insert_event(stream, payload_json, trace_context, key)
    return wake_guarded(
        config,
        alias,
        lambda row: ops.insert_event_guarded(stream, payload_json, trace_context, key, wake=row),
    )


_local = threading.local()


def _generic_ops(alias: str) -> BufferOps:
    """The generic buffer's operations on *alias*, kept for this thread's connection
    (they build each statement once: ``publish()`` is a hot path): one per database and
    thread, built anew when the thread's connection object is another one."""
    connection = connections[alias]
    kept: dict[str, BufferOps] = _local.__dict__.setdefault("ops", {})
    ops = kept.get(alias)
    if ops is None or ops.connection is not connection:
        ops = buffer_ops(OutboxEvent, alias=alias)
        with on_database(alias):  # (whether the stream's state is there too, read once)
            ops.wake_guarded  # noqa: B018
        kept[alias] = ops
    return ops


@on_stream_database
def publish_many(stream: str, payloads: Iterable[Any], *, chunk_size: int = 1000) -> int:
    """Insert many events for *stream* in bulk; return how many were inserted.

    The rows are written *chunk_size* to an INSERT statement (it has nothing to do with
    the stream's ``BATCH_SIZE``, the rows of one handler call).

    Payloads are checked as :func:`publish` checks them, all before anything is written.
    The commit wakes the stream's run loop, as ``bulk_create()`` of any buffer does.
    """
    config = _check(stream)
    events = []
    for payload in payloads:
        _dumps(stream, payload)
        # None alone would be written as SQL NULL; publish() stores it as JSON null too.
        value = _JSON_NULL if payload is None else payload
        key = _order_key(config, payload)
        events.append(OutboxEvent(stream=stream, payload=value, order_key=key))
    OutboxEvent.objects.using(config.alias).bulk_create(events, batch_size=chunk_size)
    return len(events)


async def apublish(stream: str, payload: Any) -> int:
    """:func:`publish` from async code (an async view, say); return the new event's id.

    Runs ``publish()`` with ``sync_to_async(thread_sensitive=True)``: in the thread where
    the request's other thread-sensitive work runs, on that thread's connection. Called
    on its own, the INSERT commits at once (autocommit) and the commit wakes the stream.
    To publish inside a transaction with other writes, put the transaction and its writes
    in one sync function (with ``transaction.atomic()`` and ``publish()``) and await that
    function through ``sync_to_async``: a transaction cannot span ``await`` points.
    """
    return await sync_to_async(publish, thread_sensitive=True)(stream, payload)


async def apublish_many(stream: str, payloads: Iterable[Any], *, chunk_size: int = 1000) -> int:
    """:func:`publish_many` from async code; return how many events were inserted.

    As :func:`apublish`: one thread-sensitive call, committed at once unless a sync
    function holding a transaction is what calls ``publish_many()``. *payloads* is read
    in that thread (pass a list rather than a generator over async data).
    """
    return await sync_to_async(publish_many, thread_sensitive=True)(
        stream, payloads, chunk_size=chunk_size
    )
