"""Publish events to the generic buffer, inside the caller's transaction."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django_outbox.conf import get_stream
from django_outbox.exceptions import PayloadError, WrongBufferModel
from django_outbox.models import OutboxEvent


def _check(stream: str) -> None:
    config = get_stream(stream)
    if not config.is_generic:
        raise WrongBufferModel(
            f"Stream {stream!r} buffers into {config.model}; create {config.model} rows "
            "instead of calling publish()."
        )


def _checked_payload(stream: str, payload: Any) -> Any:
    try:
        json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PayloadError(
            f"The payload for stream {stream!r} is not JSON: {exc}. Pass dicts, lists, "
            "strings, numbers, booleans and None only (no NaN or infinity)."
        ) from exc
    return payload


def publish(stream: str, payload: Any) -> OutboxEvent:
    """Insert one event for *stream*; it becomes visible to workers when you commit."""
    _check(stream)
    return OutboxEvent.objects.create(stream=stream, payload=_checked_payload(stream, payload))


def publish_many(stream: str, payloads: Iterable[Any], *, batch_size: int = 1000) -> int:
    """Insert many events for *stream* in bulk; return how many were inserted."""
    _check(stream)
    events = [OutboxEvent(stream=stream, payload=_checked_payload(stream, p)) for p in payloads]
    OutboxEvent.objects.bulk_create(events, batch_size=batch_size)
    return len(events)
