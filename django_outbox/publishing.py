"""Publish events to the generic buffer, inside the caller's transaction.

``publish()`` is on the hot path of the application's own transactions, so it costs one
INSERT and nothing else: the payload is checked and serialized once, and the row is
written with a single vendor statement instead of a model save (no model signals are
sent for ``OutboxEvent``). On PostgreSQL the same statement asks whether a run of the
stream is in flight; when one is, the commit needs no wake of its own
(:mod:`django_outbox.db.wake_guard`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from django.db.models import JSONField, Value

from django_outbox.conf import StreamConfig, get_stream
from django_outbox.db import buffer_ops
from django_outbox.exceptions import PayloadError, WrongBufferModel
from django_outbox.jsondata import MAX_DEPTH, dumps_or
from django_outbox.models import OutboxEvent
from django_outbox.runs import wake

__all__ = [
    "publish",
    "publish_many",
]

_JSON_NULL = Value(None, output_field=JSONField())


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
            "dicts, lists, strings, numbers, booleans and None only (no NaN or infinity, "
            f"no NUL characters), nested at most {MAX_DEPTH} levels."
        ),
        payload,
    )


def publish(stream: str, payload: Any) -> int:
    """Insert one event for *stream* and return its id.

    The event becomes visible to workers when the surrounding transaction commits, and
    disappears with it if it rolls back. The commit wakes the stream's run loop (see
    :func:`django_outbox.runs.wake`).
    """
    _check(stream)
    payload_json = _dumps(stream, payload)
    ops = buffer_ops(OutboxEvent)
    started = time.monotonic()
    event_id, guarded = ops.insert_event_guarded(stream, payload_json)
    wake(stream, using=ops.connection.alias, guarded_since=started if guarded else None)
    return event_id


def publish_many(stream: str, payloads: Iterable[Any], *, batch_size: int = 1000) -> int:
    """Insert many events for *stream* in bulk; return how many were inserted.

    The commit wakes the stream's run loop, as ``bulk_create()`` of any buffer does.
    """
    _check(stream)
    events = []
    for payload in payloads:
        _dumps(stream, payload)
        # None alone would be written as SQL NULL; publish() stores it as JSON null too.
        value = _JSON_NULL if payload is None else payload
        events.append(OutboxEvent(stream=stream, payload=value))
    OutboxEvent.objects.bulk_create(events, batch_size=batch_size)
    return len(events)
