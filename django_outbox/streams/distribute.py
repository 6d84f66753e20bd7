"""Distribute: the safety net on each stream's schedule. It never sets the pace.

It rescues groups whose lease expired (a worker died) or whose retry is due, and
restarts runs for a backlog that no run is taking (a wake that was lost with its
process). Work otherwise starts on commit. Resuming a stream distributes it too
(:func:`django_outbox.streams.steer.set_paused`).

A group waiting for its retry is not left to the schedule: :func:`retry_group` runs
when its backoff (or the stream's pause) ends, handed over at that time
(:func:`django_outbox.streams.groups.arm_retries`).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from django_outbox.conf import get_stream, on_stream_database, outbox_settings
from django_outbox.models.groups import GroupState, OutboxGroup
from django_outbox.streams import claim_floor
from django_outbox.streams.attempt import AttemptOutcome
from django_outbox.streams.budget import admits
from django_outbox.streams.groups import arm_retries
from django_outbox.streams.rescue import requeue_due_groups
from django_outbox.streams.run import effective_batch_size, run_stream, runtime_state, start_runs
from django_outbox.streams.sql import stream_buffer

__all__ = ["DistributeResult", "distribute_all", "distribute_stream", "retry_group"]

#: A retry delivered before its group is due (the clocks of two machines differ) is
#: handed over again, at least this much later.
EARLY_RETRY_SECONDS = 0.1


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
def distribute_stream(stream: str) -> DistributeResult:
    """Rescue the stream's due groups, then start runs for a backlog nobody takes.

    The safety net on the stream's schedule (:func:`distribute_all`), and what
    resuming a stream does. Groups that are due again (a retry whose backoff has
    passed, or a lease that expired) are re-enqueued first. The backlog is counted up
    to ``RUNS`` batches, so the count costs the same whatever the backlog; runs start
    for it up to ``RUNS`` in flight. Where the stream keeps a claim floor, a floor
    that passed the lowest unclaimed row (the count reads it) is lowered below it
    first: the floor's safety net (:mod:`django_outbox.streams.claim_floor`). Paused streams
    are skipped, and so are streams under a handler's pause until it ends.
    """
    config = get_stream(stream)
    state = runtime_state(stream)
    if state.paused or not admits(config, state, calls_next=True):
        return DistributeResult(stream, paused=True)
    requeued, exhausted = requeue_due_groups(config)
    batch_size = effective_batch_size(config, state)
    cap = config.runs * batch_size
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


def start_backlog_runs(stream: str, backlog: int, batch_size: int) -> int:
    """Start as many runs as *backlog* rows fill batches, up to ``RUNS`` (distribute),
    each with a reservation: their jobs claim the rows when they run."""
    if backlog <= 0:
        return 0
    return start_runs(stream, math.ceil(backlog / batch_size), reserve=True)


def distribute_all() -> list[DistributeResult]:
    """Distribute every configured stream."""
    return [distribute_stream(name) for name in outbox_settings().streams]


@on_stream_database
def retry_group(stream: str, group_id: uuid.UUID | str) -> list[AttemptOutcome]:
    """A group's retry, delivered when it fell due: take the group again and run the
    stream's loop from it (the outcome of each group this job processed).

    A group that is no longer waiting (an operator retried or dead-lettered it, a
    distribute took it first) is left alone; one that is not due yet (the worker's clock
    is ahead of the database's) is handed over again for its time.
    """
    config = get_stream(stream)
    group_id = uuid.UUID(str(group_id))
    requeued, _ = requeue_due_groups(config, ids=[group_id], hand_off=False)
    if requeued:
        return run_stream(stream, group_id)
    waiting = OutboxGroup.objects.filter(id=group_id, state=GroupState.RETRYING)
    due = waiting.values_list("next_attempt_at", flat=True).first()
    if due is not None:
        soonest = timezone.now() + timedelta(seconds=EARLY_RETRY_SECONDS)
        arm_retries(config, [group_id], max(due, soonest))
    return []
