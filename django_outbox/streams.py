"""Runtime state of streams: pause, batch-size override, claim jobs in flight."""

from __future__ import annotations

from django.db.models import F
from django.db.models.functions import Greatest, Now

from django_outbox.conf import StreamConfig, get_stream
from django_outbox.models import StreamState


def runtime_state(stream: str) -> StreamState:
    """Return the stream's state row, creating it on first use."""
    state, _ = StreamState.objects.get_or_create(stream=stream)
    return state


def effective_batch_size(config: StreamConfig, state: StreamState | None) -> int:
    if state is not None and state.batch_size_override:
        return state.batch_size_override
    return config.batch_size


def set_paused(stream: str, paused: bool) -> None:
    """Pause or resume a stream; the next distribute and claim obey it."""
    get_stream(stream)
    runtime_state(stream)
    StreamState.objects.filter(stream=stream).update(paused=paused, updated_at=Now())


def release_claim_slot(stream: str) -> None:
    """Record that one claim chain of *stream* ended."""
    StreamState.objects.filter(stream=stream).update(
        claims_in_flight=Greatest(F("claims_in_flight") - 1, 0), claims_touched_at=Now()
    )
