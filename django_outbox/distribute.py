"""Distribute: estimate a stream's backlog, start claim chains, re-enqueue due groups."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from django_outbox import transport
from django_outbox.conf import StreamConfig, get_stream, outbox_settings
from django_outbox.db import buffer_ops, connection_for
from django_outbox.models import GroupState, OutboxGroup, StreamState
from django_outbox.process import exhaust_group
from django_outbox.streams import effective_batch_size, runtime_state


@dataclass(frozen=True)
class DistributeResult:
    stream: str
    paused: bool = False
    backlog: int = 0
    backlog_capped: bool = False
    claims_enqueued: int = 0
    groups_enqueued: int = 0
    groups_exhausted: int = 0


def distribute(stream: str) -> DistributeResult:
    """Top the stream's claim jobs in flight up to what its backlog needs.

    The backlog is counted up to ``MAX_BATCHES * batch size`` rows, so the count costs
    the same whatever the backlog. Groups that are due again (a retry whose backoff has
    passed, or a lease that expired) are re-enqueued first. Paused streams are skipped.
    """
    config = get_stream(stream)
    state = runtime_state(stream)
    if state.paused:
        return DistributeResult(stream, paused=True)
    requeued, exhausted = requeue_due_groups(config)
    batch_size = effective_batch_size(config, state)
    cap = config.max_batches * batch_size
    ops = buffer_ops(config.model_class)
    backlog = ops.count_unclaimed(cap, stream if config.is_generic else None)
    needed = min(math.ceil(backlog / batch_size), config.max_batches)
    with transaction.atomic(using=connection_for(StreamState).alias):
        state = StreamState.objects.select_for_update().get(stream=stream)
        in_flight = state.claims_in_flight
        if _claims_look_lost(state, config):
            in_flight = 0
        top_up = max(0, needed - in_flight)
        transport.enqueue(transport.CLAIM, [(stream,)] * top_up, cluster=config.cluster)
        if top_up or in_flight != state.claims_in_flight:
            StreamState.objects.filter(stream=stream).update(
                claims_in_flight=in_flight + top_up, claims_touched_at=Now()
            )
    return DistributeResult(
        stream,
        backlog=backlog,
        backlog_capped=backlog >= cap,
        claims_enqueued=top_up,
        groups_enqueued=requeued,
        groups_exhausted=exhausted,
    )


def distribute_all() -> list[DistributeResult]:
    """Distribute every configured stream."""
    return [distribute(name) for name in outbox_settings().streams]


def _claims_look_lost(state: StreamState, config: StreamConfig) -> bool:
    """Whether the counted claim jobs have shown no sign of life for a whole lease.

    A claim job can vanish (a killed cluster, a non-transactional broker); without
    this the counter would stay up and distribute would never start a chain again.
    """
    if state.claims_in_flight <= 0 or state.claims_touched_at is None:
        return False
    return StreamState.objects.filter(
        pk=state.pk,
        claims_touched_at__lt=Now() - timedelta(seconds=config.lease_seconds),
    ).exists()


def requeue_due_groups(config: StreamConfig) -> tuple[int, int]:
    """Re-enqueue groups whose retry is due or whose lease expired.

    A group whose worker died while running it has used an attempt; when that was its
    last one, it is exhausted instead of run again, so a group that kills its worker
    cannot loop forever. Returns (re-enqueued, exhausted).
    """
    lease = timedelta(seconds=config.lease_seconds)
    due = Q(state=GroupState.RETRYING, next_attempt_at__lte=Now()) | Q(
        state__in=[GroupState.CLAIMED, GroupState.RUNNING], lease_expires_at__lt=Now()
    )
    requeued: list[str] = []
    exhausted = 0
    with transaction.atomic(using=connection_for(OutboxGroup).alias):
        groups = list(
            OutboxGroup.objects.select_for_update(skip_locked=True)
            .filter(due, stream=config.name)
            .values("id", "state", "attempt")[: config.max_batches]
        )
        spent = [
            g
            for g in groups
            if g["state"] == GroupState.RUNNING and g["attempt"] >= config.max_attempts
        ]
        for group in spent:
            exhaust_group(
                config, group["id"], group["attempt"], "lease expired on the last attempt"
            )
            exhausted += 1
        again = [g["id"] for g in groups if g not in spent]
        if again:
            OutboxGroup.objects.filter(id__in=again).update(
                state=GroupState.CLAIMED,
                lease_expires_at=Now() + lease,
                next_attempt_at=None,
                updated_at=Now(),
            )
            requeued = [str(group_id) for group_id in again]
            transport.enqueue(
                transport.PROCESS, [(config.name, gid) for gid in requeued], cluster=config.cluster
            )
    return len(requeued), exhausted
