"""Publish events to the generic buffer, inside the caller's transaction.

``publish()`` is on the hot path of the application's own transactions, so it costs one
INSERT and nothing else: the payload is checked and serialized once, and the row is
written with a single vendor statement instead of a model save (no model signals are
sent for ``OutboxEvent``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django_outbox.conf import StreamConfig, get_stream
from django_outbox.db import buffer_ops, connection_for
from django_outbox.exceptions import PayloadError, WrongBufferModel
from django_outbox.models import OutboxEvent
from django_outbox.streams import kick


def _check(stream: str) -> StreamConfig:
    config = get_stream(stream)
    if not config.is_generic:
        raise WrongBufferModel(
            f"Stream {stream!r} buffers into {config.model}; create {config.model} rows "
            "instead of calling publish()."
        )
    return config


def _dumps(stream: str, payload: Any) -> str:
    try:
        return json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PayloadError(
            f"The payload for stream {stream!r} is not JSON: {exc}. Pass dicts, lists, "
            "strings, numbers, booleans and None only (no NaN or infinity)."
        ) from exc


def publish(stream: str, payload: Any) -> int:
    """Insert one event for *stream* and return its id.

    The event becomes visible to workers when the surrounding transaction commits, and
    disappears with it if it rolls back. With the stream's ``KICK`` on, the commit also
    starts a claim (see :func:`django_outbox.streams.kick`).
    """
    config = _check(stream)
    event_id = buffer_ops(OutboxEvent).insert_event(stream, _dumps(stream, payload))
    if config.kick:
        kick(stream, using=connection_for(OutboxEvent).alias)
    return event_id


def publish_many(stream: str, payloads: Iterable[Any], *, batch_size: int = 1000) -> int:
    """Insert many events for *stream* in bulk; return how many were inserted."""
    config = _check(stream)
    events = []
    for payload in payloads:
        _dumps(stream, payload)
        events.append(OutboxEvent(stream=stream, payload=payload))
    OutboxEvent.objects.bulk_create(events, batch_size=batch_size)
    if config.kick and events:
        kick(stream, using=connection_for(OutboxEvent).alias)
    return len(events)
