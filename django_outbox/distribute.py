"""Distribute: the safety net on each stream's schedule. It never sets the pace.

It rescues groups whose lease expired (a worker died) or whose retry is due, and
restarts runs for a backlog that no run is taking (a wake that was lost with its
process). Work otherwise starts on commit (see :mod:`django_outbox.runs`).
"""

from __future__ import annotations

from dataclasses import dataclass

from django_outbox import claim_floor
from django_outbox.conf import get_stream, on_stream_database, outbox_settings
from django_outbox.db import stream_buffer
from django_outbox.rescue import requeue_due_groups
from django_outbox.runs import effective_batch_size, runtime_state, start_backlog_runs


@dataclass(frozen=True)
class DistributeResult:
    stream: str
    paused: bool = False
    backlog: int = 0
    backlog_capped: bool = False
    runs_started: int = 0
    groups_enqueued: int = 0
    groups_exhausted: int = 0


@on_stream_database
def distribute(stream: str) -> DistributeResult:
    """Rescue the stream's due groups, then start runs for a backlog nobody takes.

    Groups that are due again (a retry whose backoff has passed, or a lease that
    expired) are re-enqueued first. The backlog is counted up to ``CHAINS`` batches,
    so the count costs the same whatever the backlog; runs start for it up to
    ``CHAINS`` in flight. Where the stream keeps a claim floor, a floor that passed the
    lowest unclaimed row (the count reads it) is lowered below it first: the floor's
    safety net (:mod:`django_outbox.claim_floor`). Paused streams are skipped.
    """
    config = get_stream(stream)
    state = runtime_state(stream)
    if state.paused:
        return DistributeResult(stream, paused=True)
    requeued, exhausted = requeue_due_groups(config)
    batch_size = effective_batch_size(config, state)
    cap = config.chains * batch_size
    backlog, lowest_id = stream_buffer(config).backlog(cap)
    claim_floor.lower_if_passed(config, lowest_id)
    started = start_backlog_runs(stream, backlog, batch_size)
    return DistributeResult(
        stream,
        backlog=backlog,
        backlog_capped=backlog >= cap,
        runs_started=started,
        groups_enqueued=requeued,
        groups_exhausted=exhausted,
    )


def distribute_all() -> list[DistributeResult]:
    """Distribute every configured stream."""
    return [distribute(name) for name in outbox_settings().streams]
