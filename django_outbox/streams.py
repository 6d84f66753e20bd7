"""Runtime state of streams: pause, batch-size override, claim jobs in flight."""

from __future__ import annotations

from django.db import transaction
from django.db.models.functions import Now

from django_outbox import transport
from django_outbox.conf import StreamConfig, get_stream
from django_outbox.db import connection_for
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


def continue_chain(stream: str, *, full: bool) -> bool:
    """Give back a finished claim's slot; continue its chain if it was full and needed.

    A full claim enqueues its successor while fewer than the stream's ``CHAINS`` claims
    are left in flight: distribute's wave covers the backlog it counted, and up to
    ``CHAINS`` chains carry on past it. Returns whether the chain continues.
    """
    alias = connection_for(StreamState).alias
    with transaction.atomic(using=alias):
        state, _ = StreamState.objects.select_for_update().get_or_create(stream=stream)
        in_flight = max(state.claims_in_flight - 1, 0)
        successor = full and in_flight < get_stream(stream).chains
        if successor:
            transport.enqueue(transport.CLAIM, [(stream,)], cluster=get_stream(stream).cluster)
            in_flight += 1
        StreamState.objects.filter(stream=stream).update(
            claims_in_flight=in_flight, claims_touched_at=Now()
        )
    return successor
