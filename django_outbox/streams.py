"""Runtime state of streams: pause, batch-size override, claim jobs in flight."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connections, transaction
from django.db.models import BooleanField, ExpressionWrapper, Q
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


#: Kicks of one stream closer together than this write the state row once. A claim that
#: started less than this after the last recorded kick is followed by one more claim, so
#: the rows of a kick that was folded into an earlier one are never left behind.
KICK_DEBOUNCE = timedelta(milliseconds=100)


def continue_chain(stream: str, *, full: bool, started_at: datetime | None = None) -> bool:
    """Give back a finished claim's slot; continue its chain if it was full and needed.

    A full claim enqueues its successor while fewer than the stream's ``CHAINS`` claims
    are left in flight: distribute's wave covers the backlog it counted, and up to
    ``CHAINS`` chains carry on past it. A claim that started (*started_at*, database
    clock) before a recent kick may have missed the rows that kick announced, so it is
    followed by one more claim too. Returns whether the chain continues.
    """
    alias = connection_for(StreamState).alias
    with transaction.atomic(using=alias):
        state, _ = StreamState.objects.select_for_update().get_or_create(stream=stream)
        in_flight = max(state.claims_in_flight - 1, 0)
        kicked = (
            started_at is not None
            and state.kicked_at is not None
            and state.kicked_at + KICK_DEBOUNCE >= started_at
        )
        successor = (full or kicked) and in_flight < get_stream(stream).chains
        if successor:
            transport.enqueue(transport.CLAIM, [(stream,)], cluster=get_stream(stream).cluster)
            in_flight += 1
        StreamState.objects.filter(stream=stream).update(
            claims_in_flight=in_flight, claims_touched_at=Now()
        )
    return successor


class _Kick:
    """The on-commit callback of :func:`kick`; one per stream and transaction."""

    def __init__(self, stream: str) -> None:
        self.stream = stream

    def __call__(self) -> None:
        start_kicked_claim(self.stream)


def kick(stream: str, *, using: str | None = None) -> None:
    """Start a claim of *stream* as soon as the current transaction commits.

    ``publish()`` and ``publish_many()`` call this for streams with ``KICK`` on; call it
    yourself after writing rows of a custom buffer model. Within one transaction the
    stream is kicked once, whatever the number of calls; a rolled-back transaction kicks
    nothing. Outside a transaction the kick happens at once.
    """
    get_stream(stream)
    alias = using or connection_for(StreamState).alias
    connection = connections[alias]
    if connection.in_atomic_block:
        for entry in connection.run_on_commit:
            callback = entry[1]
            if isinstance(callback, _Kick) and callback.stream == stream:
                return
    transaction.on_commit(_Kick(stream), using=alias)


def start_kicked_claim(stream: str) -> bool:
    """Enqueue a claim of *stream* unless one is in flight; record the kick either way.

    A kick within ``KICK_DEBOUNCE`` of the last recorded one costs one SELECT and changes
    nothing: the claims of that kick continue until one starts after it (see
    :func:`continue_chain`). Otherwise one short transaction locks the state row and
    either starts a claim (none in flight, not paused) or records the kick's time for
    the claims in flight. Returns whether a claim was enqueued.
    """
    config = get_stream(stream)
    alias = connection_for(StreamState).alias
    due = Q(kicked_at__isnull=True) | Q(kicked_at__lt=Now() - KICK_DEBOUNCE)
    states = StreamState.objects.using(alias).filter(stream=stream)
    is_due = states.annotate(due=ExpressionWrapper(due, output_field=BooleanField()))
    is_due = is_due.values_list("due", flat=True)
    current = is_due.first()
    if current is None:  # the stream's very first kick
        runtime_state(stream)
        current = is_due.first()
    if not current:
        return False
    with transaction.atomic(using=alias):
        # Decide under the row lock that continue_chain takes too: a claim that ends
        # meanwhile either has given back its slot (then this kick starts a claim) or
        # will see this kick's time (then it continues). Deciding on the unlocked read
        # above could record a kick just after the last claim in flight had ended.
        locked = states.select_for_update().values("paused", "claims_in_flight").get()
        if not locked["paused"] and locked["claims_in_flight"] <= 0:
            states.update(kicked_at=Now(), claims_in_flight=1, claims_touched_at=Now())
            transport.enqueue(transport.CLAIM, [(stream,)], cluster=config.cluster)
            return True
        states.update(kicked_at=Now())
    return False
