"""Distribute: the safety net on each stream's schedule. It never sets the pace.

It rescues groups whose lease expired (a worker died) or whose retry is due, and
restarts runs for a backlog that no run is taking (a wake that was lost with its
process). Work otherwise starts on commit (see :mod:`django_outbox.runs`).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from django_outbox import process, transport
from django_outbox.batch import group_leases, group_policy
from django_outbox.conf import StreamConfig, get_stream, outbox_settings
from django_outbox.db import stream_buffer
from django_outbox.models import GroupState, OutboxGroup
from django_outbox.runs import effective_batch_size, runtime_state, start_backlog_runs

#: At most this many due groups are rescued per stream and distribute.
RESCUE_LIMIT = 500


@dataclass(frozen=True)
class DistributeResult:
    stream: str
    paused: bool = False
    backlog: int = 0
    backlog_capped: bool = False
    runs_started: int = 0
    groups_enqueued: int = 0
    groups_exhausted: int = 0


def distribute(stream: str) -> DistributeResult:
    """Rescue the stream's due groups, then start runs for a backlog nobody takes.

    Groups that are due again (a retry whose backoff has passed, or a lease that
    expired) are re-enqueued first. The backlog is counted up to ``CHAINS`` batches,
    so the count costs the same whatever the backlog; runs start for it up to
    ``CHAINS`` in flight. Paused streams are skipped.
    """
    config = get_stream(stream)
    state = runtime_state(stream)
    if state.paused:
        return DistributeResult(stream, paused=True)
    requeued, exhausted = requeue_due_groups(config)
    batch_size = effective_batch_size(config, state)
    cap = config.chains * batch_size
    backlog = stream_buffer(config).count_unclaimed(cap)
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


def requeue_due_groups(
    config: StreamConfig, *, ids: Collection[uuid.UUID] | None = None
) -> tuple[int, int]:
    """Re-enqueue groups whose retry is due or whose lease expired (of *ids*, if given).

    A group whose worker died while running it has used an attempt; when that was its
    last one, it is exhausted instead of run again, so a group that kills its worker
    cannot loop forever. Returns (re-enqueued, exhausted).
    """
    lease = timedelta(seconds=config.lease_seconds)
    waiting = [GroupState.RETRYING, GroupState.DEAD_LETTERING]
    due = Q(state__in=waiting, next_attempt_at__lte=Now()) | Q(
        state=GroupState.CLAIMED, lease_expires_at__lt=Now()
    )
    filters: dict[str, Any] = {"stream": config.name}
    if ids is not None:
        filters["id__in"] = list(ids)
    requeued: list[str] = []
    exhausted = 0
    leases, retry = group_leases(config), group_policy(config)
    with transaction.atomic(using=leases.alias):
        groups = leases.expired(
            RESCUE_LIMIT, due=due, fields=("last_error", "row_errors"), **filters
        )
        # A lost attempt counts: a group that kills its worker is dead-lettered after its
        # last attempt instead of looping.
        spent = [
            g
            for g in groups
            if g["state"] == GroupState.DEAD_LETTERING
            or (g["state"] == GroupState.RUNNING and retry.exhausted(g["attempt"]))
        ]
        for group in spent:
            # Each group in a savepoint of its own: one that cannot be dead-lettered is
            # kept with its error and the others go on.
            error = (
                process.group_error(group["last_error"])
                if group["state"] == GroupState.DEAD_LETTERING
                else "lease expired on the last attempt"
            )
            rows = process.exhaust_group(
                config, group["pk"], group["attempt"], error, row_errors=group["row_errors"]
            )
            exhausted += rows is not None
        again = [g["pk"] for g in groups if g not in spent]
        if again:
            OutboxGroup.objects.filter(id__in=again).update(
                state=GroupState.CLAIMED,
                lease_expires_at=Now() + lease,
                next_attempt_at=None,
                updated_at=Now(),
            )
            requeued = [str(group_id) for group_id in again]
            transport.enqueue(
                transport.RUN, [(config.name, gid) for gid in requeued], cluster=config.cluster
            )
    return len(requeued), exhausted
